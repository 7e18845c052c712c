"""``python -m hostcheck`` / ``hostcheck``: check a provisioned GPU node and print a readiness score.

Exit codes: 0 ready, 1 not ready, 2 usage or environment error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
import traceback
from typing import Any

from hostcheck import SCHEMA_VERSION, __version__
from hostcheck.argtypes import duration, seconds
from hostcheck.registry import Check, Result, all_checks, run_checks, select
from hostcheck.score import FAIL_LEVELS, Verdict, verdict
from hostcheck.workload.runner import python_arg

EXIT_READY, EXIT_NOT_READY, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    pass


class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived: the run ends, its children with it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_signalled(signum: int, frame: Any) -> None:
    raise _Signalled(signum)


class _OutputError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 itself; we return 2 from main instead
        raise _UsageError(message)

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse drops a failed write (--help >/dev/full would "succeed"); say so and exit 2.
        if not message:
            return
        file = file or sys.stderr
        try:
            file.write(message)
            file.flush()
        except (AttributeError, OSError) as exc:
            raise _OutputError(getattr(exc, "strerror", None) or str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="hostcheck",
        description="Check a gpunode GPU node after provisioning: versions, GPU health, host tuning. "
        "Prints a readiness score 0-100 and a fix for every shortfall.",
        epilog="Exit codes: 0 ready, 1 not ready, 2 usage or environment error, 130/143 SIGINT/SIGTERM. "
        "Docs: docs/hostcheck.md. "
        "`hostcheck bench --help`: measure what each CPU-side tuning buys (docs/bench.md).",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--json", action="store_true", help="print the JSON document (schema_version 1) instead of text"
    )
    out.add_argument(
        "--prometheus", metavar="PATH", help="also write a node_exporter textfile (.prom) to PATH"
    )
    out.add_argument("--junit", metavar="PATH", help="also write JUnit XML to PATH")
    out.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour (default: auto)"
    )
    out.add_argument("-v", "--verbose", action="store_true", help="show per-GPU details under each check")
    sel = p.add_argument_group("selection")
    sel.add_argument("--list", action="store_true", help="list the checks and exit")
    sel.add_argument(
        "--only", action="append", metavar="ID|CATEGORY", help="run only these (comma list, repeatable)"
    )
    sel.add_argument(
        "--skip", action="append", metavar="ID|CATEGORY", help="skip these (comma list, repeatable)"
    )
    sel.add_argument("--quick", action="store_true", help="leave out the workload checks (GPU jobs)")
    ver = p.add_argument_group("verdict")
    ver.add_argument(
        "--fail-level",
        choices=tuple(FAIL_LEVELS),
        default="fail",
        help="not ready when any check is at this level or worse (errors count as fail; default: fail)",
    )
    ver.add_argument(
        "--min-score", type=int, default=0, metavar="N", help="not ready when the score is below N"
    )
    env = p.add_argument_group("environment")
    env.add_argument(
        "--expect-gpus", type=int, metavar="N", help="GPUs this node must have (default: local facts)"
    )
    env.add_argument(
        "--python",
        metavar="PATH",
        type=python_arg,
        help="the training Python to probe (default: the venv in the facts)",
    )
    env.add_argument("--facts-dir", default="/etc/ansible/facts.d", metavar="DIR", help="Ansible local facts")
    env.add_argument(
        "--env-file", metavar="PATH", help="training environment file (default: /etc/gpunode/training.env)"
    )
    env.add_argument(
        "--timeout", type=seconds, default=30.0, metavar="S", help="per-check timeout (default 30)"
    )
    env.add_argument(
        "--torch-timeout",
        type=seconds,
        default=90.0,
        metavar="S",
        help="timeout of the torch probe (default 90)",
    )
    wl = p.add_argument_group("workload")
    wl.add_argument(
        "--burn", type=duration, default=0.0, metavar="SECONDS", help="add a matmul stress run of this length"
    )
    wl.add_argument(
        "--workload-timeout",
        type=seconds,
        default=180.0,
        metavar="S",
        help="hard limit of the workload probe process (default 180)",
    )
    wl.add_argument(
        "--nnodes", metavar="N", help="multi-node DDP check through torchrun (with --rdzv-endpoint)"
    )
    wl.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous, the same on every node")
    wl.add_argument(
        "--rdzv-id", default="hostcheck", metavar="ID", help="rendezvous id, the same on every node"
    )
    wl.add_argument("--nproc-per-node", type=int, metavar="N", help="ranks per node (default: one per GPU)")
    wl.add_argument(
        "--rdzv-timeout",
        type=seconds,
        default=300.0,
        metavar="S",
        help="hard limit of the multi-node run, rendezvous included (default 300)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    p.add_argument("--version", action="version", version=f"hostcheck {__version__}")
    return p


def _split(values: list[str] | None) -> list[str]:
    return [x.strip() for v in values or [] for x in v.split(",") if x.strip()]


def evaluate(
    snapshot: Any, checks: list[Check], fail_level: str = "fail", min_score: int = 0, timeout_s: float = 30.0
) -> tuple[list[Result], Verdict]:
    """Judge a gathered snapshot: the pure half of a run (tests call this with fixture snapshots)."""
    results = run_checks(checks, snapshot, timeout_s)
    return results, verdict(results, fail_level=fail_level, min_score=min_score)


def build_report(snapshot: Any, results: list[Result], v: Verdict, started: float, when: str) -> Any:
    from hostcheck.report import Report, host_info, versions

    return Report(
        results=tuple(results),
        verdict=v,
        host=host_info(snapshot),
        versions=versions(snapshot),
        time=when,
        duration_s=time.monotonic() - started,
        exit_code=EXIT_READY if v.ready else EXIT_NOT_READY,
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["bench"]:  # `hostcheck bench ...`: the tuning benchmark, its own options
        from hostcheck.bench.cli import main as bench_main

        return bench_main(args[1:])
    from hostcheck.workload.runner import reopen

    reopen()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, _raise_signalled)
        except ValueError:  # not the main thread (tests): leave the signals alone
            break
    try:
        return _main(argv)
    except _UsageError as exc:
        msg = str(exc) if "(see --" in str(exc) else f"{exc} (see --help)"
        print(f"hostcheck: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except _OutputError as exc:
        print(f"hostcheck: error: writing to standard output: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_READY
    except (_Signalled, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, _Signalled) else signal.SIGINT
        # The gatherers' threads may never get to clean up: every running child is killed from here.
        from hostcheck.workload.runner import kill_all

        killed = kill_all()
        name = signal.Signals(signum).name
        print(
            f"hostcheck: interrupted by {name}; {killed} child process(es) killed, no report", file=sys.stderr
        )
        return 128 + signum
    except Exception as exc:
        if "--debug" in (argv if argv is not None else sys.argv):
            traceback.print_exc()
        print(
            f"hostcheck: internal error: {type(exc).__name__}: {exc} (re-run with --debug)", file=sys.stderr
        )
        return EXIT_USAGE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    started = time.monotonic()
    args = build_parser().parse_args(argv)
    try:
        checks = select(all_checks(), _split(args.only), _split(args.skip), args.quick)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if args.list:
        if args.json:
            rows = [
                {
                    "id": c.id,
                    "title": c.title,
                    "category": c.category,
                    "weight": c.weight,
                    "workload": c.workload,
                }
                for c in checks
            ]
            sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, "checks": rows}, indent=2) + "\n")
            return EXIT_READY
        from hostcheck.render.text import render_list

        sys.stdout.write(render_list(checks))
        return EXIT_READY
    if not checks:
        raise _UsageError("no checks selected")
    if args.expect_gpus is not None and args.expect_gpus < 0:
        raise _UsageError("--expect-gpus must be >= 0")
    if not 0 <= args.min_score <= 100:
        raise _UsageError("--min-score must be 0-100")
    if bool(args.nnodes) != bool(args.rdzv_endpoint):
        raise _UsageError("--nnodes and --rdzv-endpoint go together")
    if args.nnodes and not re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", args.nnodes):
        raise _UsageError("--nnodes takes N or MIN:MAX, e.g. 3 or 2:4")
    if args.rdzv_endpoint and not re.fullmatch(r"[^\s:]+:[0-9]{1,5}", args.rdzv_endpoint):
        raise _UsageError("--rdzv-endpoint takes HOST:PORT")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise _UsageError("--nproc-per-node must be >= 1")
    if args.quick and (args.burn or args.nnodes):
        raise _UsageError("--quick leaves the workload out: it cannot go with --burn or --nnodes")
    if args.python and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        print(f"hostcheck: error: --python {args.python}: not an executable file", file=sys.stderr)
        return EXIT_USAGE
    if sys.stdout is None:
        raise _UsageError("standard output is closed: nowhere to print the report")
    tmp_error = _temp_dir_error()
    if tmp_error:
        raise _UsageError(tmp_error)
    from hostcheck.outfile import paths_error

    bad_path = paths_error([("--prometheus", args.prometheus), ("--junit", args.junit)])
    if bad_path:
        raise _UsageError(bad_path)

    from hostcheck.gather import EXTRA_GATHERERS, GATHERERS, Options, gather
    from hostcheck.report import now_iso

    options = Options(
        expect_gpus=args.expect_gpus,
        python=args.python,
        facts_dir=args.facts_dir,
        env_file=args.env_file,
        torch_timeout_s=args.torch_timeout,
        burn=args.burn,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        nproc_per_node=args.nproc_per_node,
        workload_timeout_s=args.workload_timeout,
        rdzv_timeout_s=args.rdzv_timeout,
    )
    needs = set().union(*(c.needs for c in checks)) & (set(GATHERERS) | set(EXTRA_GATHERERS))
    when = now_iso()
    snapshot = gather(options, needs)
    results, v = evaluate(snapshot, checks, args.fail_level, args.min_score, args.timeout)
    report = build_report(snapshot, results, v, started, when)
    return emit(report, args)


def _temp_dir_error() -> str | None:
    """Children's output goes to temporary files: an unusable TMPDIR is a usage error before the run."""
    import tempfile

    try:
        with tempfile.TemporaryFile():
            pass
    except OSError as exc:
        where = os.environ.get("TMPDIR") or "the temporary folder"
        return f"cannot create a temporary file in {where} ({exc.strerror or exc}): set TMPDIR to a writable folder"
    return None


def emit(report: Any, args: argparse.Namespace) -> int:
    from hostcheck.outfile import write_report
    from hostcheck.render.json import render_json
    from hostcheck.render.junit import render_junit
    from hostcheck.render.prometheus import render_prometheus
    from hostcheck.render.text import render_text

    try:
        if args.prometheus:
            write_report(args.prometheus, render_prometheus(report))
        if args.junit:
            write_report(args.junit, render_junit(report))
    except OSError as exc:
        print(f"hostcheck: error: writing a report file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.json:
            sys.stdout.write(render_json(report))
        else:
            colour = args.color == "always" or (
                args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            )
            sys.stdout.write(render_text(report, colour=colour, verbose=args.verbose))
        sys.stdout.flush()
    except BrokenPipeError:  # `hostcheck | head`: the reader left; the verdict still stands
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError as exc:  # a full disk, /dev/full: the report did not reach its reader
        print(f"hostcheck: error: writing the report: {exc.strerror or exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_USAGE
    return report.exit_code
