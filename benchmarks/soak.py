#!/usr/bin/env python3
"""benchmarks/soak.py: the rows that failed CI now and then, run again and again beside CPU hogs.

CI runs the unit suite beside its background lanes, so a loaded machine is the normal case there. Two rows once
failed only under load: an address-space limit attack (``limits-ulimit-v-footprint+16MiB``: hostcheck hung) and
a signal row (``[15-143-bench]``: a bench child outlived SIGTERM). This runs, ``--rounds`` times (50 by default),
one pytest per round over:

- every ``ulimit -v`` row of the attack table (tests/unit/test_attacks.py) and its "threads cannot start threads"
  row;
- every signal row of the attack table (SIGHUP, SIGINT, SIGTERM and SIGKILL in the middle of check, bench, job,
  fleet and baseline);
- the signal table of tests/unit/test_command.py (each signal ends the run and every child of check and bench,
  also when it comes between a child's fork and its registration);

with ``--hogs`` busy loops (default: one per CPU) running the whole time, and writes what each row did (passed,
failed, skipped, per round) to ``--out`` (default benchmarks/soak-result.txt), with the date, the machine and
the load, after every round. The first line of each failure's message is kept below the counts.

    .venv/bin/python benchmarks/soak.py [--rounds 50] [--hogs N] [--out FILE] [-k EXPRESSION]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # benchmarks/ is no package: its folder on sys.path

REPO = Path(__file__).resolve().parents[1]
FILES = ("tests/unit/test_attacks.py", "tests/unit/test_command.py")
#: The rows soaked: the attack table's ulimit -v and signal rows, the command's signal table.
ROWS = re.compile(
    r"test_attacks\.py::test_attack\[(limits-threads-cannot-start-threads|[a-z-]*ulimit-v-[^\]]*|signal-[^\]]*)\]"
    r"|test_command\.py::test_a_signal_"
)


def collect(keyword: str | None) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *FILES]
    p = subprocess.run(argv + (["-k", keyword] if keyword else []), cwd=REPO, capture_output=True, text=True)
    ids = [ln.strip() for ln in p.stdout.splitlines() if "::" in ln and ROWS.search(ln)]
    if not ids:
        sys.exit(f"no rows collected:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return ids


def row_of(node_id: str) -> str:
    """``tests/unit/test_x.py::test_y[z]`` -> ``test_x.py::test_y[z]``: the row's name in the result."""
    path, _, name = node_id.partition("::")
    return f"{Path(path).name}::{name}"


def start_hogs(n: int) -> list[subprocess.Popen]:
    """Busy loops, each in a session of its own (ended by pid at the end, never by name)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)
    ]


def one_round(ids: list[str], junit: str) -> dict[str, tuple[str, str]]:
    """Each row's outcome (passed / failed / skipped) and, for a failure, its message's first line."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *ids]
    subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}.py::{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            out[name] = ("failed", (bad.get("message") or bad.text or "").strip().splitlines()[0][:200])
        elif case.find("skipped") is not None:
            out[name] = ("skipped", "")
        else:
            out[name] = ("passed", "")
    return out


def write(path: Path, head: list[str], counts: dict, failures: list[str], rounds: int) -> None:
    width = max(len(r) for r in counts)
    lines = [*head, f"rounds: {rounds}", "", f"{'row':<{width}}  passed  failed  skipped"]
    for row, c in sorted(counts.items()):
        lines.append(f"{row:<{width}}  {c['passed']:>6}  {c['failed']:>6}  {c['skipped']:>7}")
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    lines += ["", f"all rows: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"]
    if failures:
        lines += ["", "failures (round: row: first line):", *failures]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument(
        "--hogs", type=int, default=os.cpu_count() or 1, help="busy loops beside (default: one a CPU)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "soak-result.txt")
    ap.add_argument("-k", dest="keyword", help="only the rows pytest -k selects among these")
    args = ap.parse_args()
    ids = collect(args.keyword)
    counts: dict[str, collections.Counter] = {}
    failures: list[str] = []
    t0 = time.time()
    # Stopped early (SIGTERM, or SIGINT, which a shell's background job ignores by default): end the hogs first.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    hogs = start_hogs(args.hogs)
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            for rnd in range(1, args.rounds + 1):
                got = one_round(ids, os.path.join(tmp, "round.xml"))
                for row, (outcome, message) in got.items():
                    counts.setdefault(row, collections.Counter({"passed": 0, "failed": 0, "skipped": 0}))
                    counts[row][outcome] += 1
                    if outcome == "failed":
                        failures.append(f"{rnd}: {row}: {message}")
                missing = [row_of(i) for i in ids if row_of(i) not in got]
                failures += [f"{rnd}: {row}: no result (pytest itself failed)" for row in missing]
                head = [
                    f"soak of the CI rows that failed under load ({Path(__file__).name}), "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(t0))} to {time.strftime('%H:%M')}",
                    f"machine: {describe()}; {args.hogs} busy loop(s) beside; "
                    f"load average now {os.getloadavg()[0]:.1f} (other work on the machine too)",
                    f"rows: {len(ids)} (pytest -k {args.keyword!r})" if args.keyword else f"rows: {len(ids)}",
                ]
                write(args.out, head, counts, failures, rnd)
                print(
                    f"round {rnd}/{args.rounds}: {sum(o == 'failed' for o, _ in got.values())} failed",
                    flush=True,
                )
    finally:
        for h in hogs:
            with contextlib.suppress(OSError):
                os.killpg(h.pid, signal.SIGKILL)
            h.wait()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
