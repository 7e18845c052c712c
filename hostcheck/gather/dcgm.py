"""DCGM's diagnostics and health watches: ``dcgmi diag -r <level> -j`` and ``dcgmi health -c -j`` (docs/dcgm.md).

Running is separate from parsing: :func:`gather_dcgm` runs dcgmi through the one command runner (base.run_cmd:
its own session, its group killed at the time limit, at most :data:`MAX_OUTPUT` bytes read), and the parsers
are pure functions of the text, tested from fixtures transcribed from DCGM's sources (NVIDIA/DCGM on GitHub).

``dcgmi diag -j`` (dcgmi/Diag.cpp, the JSON keys in nvvs/include/NvvsJsonStrings.h):

- DCGM 3.x (tag v3.3.9): ``{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests":
  [{"name": "Denylist", "results": [{"status": "Pass", "gpu_id": "0", "warnings": [{"warning": MSG, "error_id":
  N, "error_category": N, "error_severity": N}], "info": TEXT}]}]}]}, "version": ..., "Driver Version
  Detected": ...}``. Statuses "Pass", "Skip", "Fail" (a warning shows as "Fail"); tests not run are left out.
  The Deployment tests give ``gpu_id`` as a number and, by a slip in HelperJsonAddBasicTests, their message
  under ``warnings`` instead of ``warning``: both are read.
- DCGM 4.x (tags v4.0.0-v4.6.0; testing/python3/dcgm_diag_schema.json): the top key is ``"DCGM Diagnostic"``;
  a result names ``entity_group`` ("GPU") and ``entity_id``; ``info`` is a list; each test has a
  ``test_summary`` with its overall ``status`` and every error (also those of no entity); ``metadata`` holds
  ``version`` and ``Driver Version Detected``. Statuses "Pass", "Skip", "Fail", "Warn" (text view only so far),
  "Not Run".
- Both: ``runtime_error`` under the top key when the diagnostic could not run (unknown test, GPUs busy, ...).

``dcgmi health -c -j`` (dcgmi/Health.cpp, dcgmi/DcgmiOutput.cpp) checks the watches set on a group (default:
all GPUs): ``{"header": ["Health Monitor Report"], "body": {"Overall Health": {"value": "Healthy"}, "GPU":
{"children": {"0": {"value": "Warning", "children": {"Errors": {"children": {"PCIe system": {"value":
"Warning", "overflow": [MSG parts]}}}}}}}}}``; results "Healthy", "Warning", "Failure". Without watches it prints
``Error: Health watches not enabled. Please enable watches.``; without a host engine ``Error: unable to establish
a connection to the specified host``. Nothing here raises: what could not be read is an Unavailable.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from typing import Any

from hostcheck.gather.base import (
    BUSY,
    ERROR,
    NOT_FOUND,
    TIMEOUT,
    CmdResult,
    Runner,
    Unavailable,
    run_cmd,
)

#: Bytes of dcgmi output read (a level-3 run of 8 GPUs prints tens of KiB); one that prints more is stopped.
MAX_OUTPUT = 4 << 20
#: Deeper JSON is not DCGM's (its diag output nests 9 levels, health 9): refused before json.loads recurses.
MAX_DEPTH = 32
#: Kept for the report: a message, a test name, the number of results.
MAX_TEXT = 500
MAX_RESULTS = 2048
#: Seconds the run keeps for judging and the report after DCGM (the profile's deadline minus this bounds dcgmi).
DEADLINE_RESERVE_S = 5.0
#: ``dcgmi health -c`` answers from the host engine's cache: seconds.
HEALTH_TIMEOUT_S = 10.0

PASS, FAIL, WARN, SKIP, NOT_RUN, UNKNOWN = "pass", "fail", "warn", "skip", "not run", "unknown"
_STATUS = {"pass": PASS, "fail": FAIL, "warn": WARN, "warning": WARN, "skip": SKIP, "not run": NOT_RUN}
#: DCGM's health results (dcgmi/Health.cpp HelperHealthToString).
HEALTHY, HEALTH_WARN, HEALTH_FAIL = "Healthy", "Warning", "Failure"


def find_dcgmi(path: str | None = None) -> str | None:
    """The dcgmi to run: ``path`` when given, else the one on PATH; None where DCGM is not installed."""
    return path or shutil.which("dcgmi")


@dataclass(frozen=True)
class DcgmMessage:
    """One of DCGM's errors or warnings: its own text and codes (dcgmlib/dcgm_errors.h: ``error_id`` a
    dcgmError_t such as 52 DCGM_FR_FAULTY_MEMORY, ``category`` a dcgmErrorCategory_t, ``severity`` a
    dcgmErrorSeverity_t: 1 monitor, 2 isolate, 4 triage, 6 drain and reset)."""

    text: str
    error_id: int | None = None
    category: int | None = None
    severity: int | None = None

    def __str__(self) -> str:
        return f"{self.text} (DCGM error {self.error_id})" if self.error_id is not None else self.text


@dataclass(frozen=True)
class DiagResult:
    """One DCGM test's result on one entity (``entity`` "GPU 0"; "" for the test as a whole)."""

    category: str
    test: str
    entity: str
    status: str
    messages: tuple[DcgmMessage, ...] = ()
    info: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagReport:
    """A ``dcgmi diag -j`` answer: DCGM's version, and every test result (or why it could not run)."""

    level: int
    version: str = ""
    driver: str = ""
    results: tuple[DiagResult, ...] = ()
    #: DCGM's own "could not run" (``runtime_error``): then ``results`` is empty.
    runtime_error: str = ""
    #: dcgmi's exit status (non-zero also when a test failed).
    rc: int = 0
    #: Results past MAX_RESULTS, not read: a report cut short is never judged as if it were whole.
    dropped: int = 0


@dataclass(frozen=True)
class HealthIncident:
    entity: str
    system: str
    health: str
    message: str


@dataclass(frozen=True)
class HealthReport:
    overall: str
    incidents: tuple[HealthIncident, ...] = ()


@dataclass(frozen=True)
class DcgmSnapshot:
    """What DCGM said on this node. ``dcgmi`` None: not installed. ``diag`` None: the profile runs no
    diagnostic (``level`` 0)."""

    dcgmi: str | None = None
    level: int = 0
    diag: DiagReport | Unavailable | None = None
    health: HealthReport | Unavailable | None = None


# --- parsing (pure) ---------------------------------------------------------------------------------------------


def _depth_ok(text: str, limit: int = MAX_DEPTH) -> bool:
    """True when no bracket nests deeper than ``limit`` outside strings (so json.loads cannot recurse far)."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def load_json(text: str) -> dict | str:
    """The JSON object in dcgmi's output (lines before it, such as a warning, are skipped), or why not."""
    start = text.find("{")
    if start < 0:
        first = text.strip().splitlines()[0][:MAX_TEXT] if text.strip() else "no output"
        return f"no JSON in dcgmi's output: {first}"
    body = text[start:]
    if not _depth_ok(body):
        return f"dcgmi's JSON nests deeper than {MAX_DEPTH} levels: not DCGM's"
    try:
        doc, _end = json.JSONDecoder().raw_decode(body)
    except (ValueError, RecursionError) as exc:
        return f"dcgmi's JSON could not be read: {str(exc)[:200]}"
    return doc if isinstance(doc, dict) else "dcgmi's JSON is not an object"


def _text(v: Any) -> str:
    return " ".join(str(v).split())[:MAX_TEXT] if isinstance(v, (str, int, float)) else ""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _status(v: Any) -> str:
    """DCGM's status, lower case; one hostcheck does not know is kept as DCGM wrote it (then warned, not judged)."""
    t = _text(v)
    return _STATUS.get(t.lower(), t[:40] or UNKNOWN)


def _messages(result: dict) -> tuple[DcgmMessage, ...]:
    out = []
    warnings = result.get("warnings")
    for w in warnings if isinstance(warnings, list) else ():
        if not isinstance(w, dict):
            continue
        # 3.x Deployment tests put the text under "warnings" (Diag.cpp HelperJsonAddBasicTests).
        text = _text(w.get("warning")) or _text(w.get("warnings"))
        if text:
            out.append(
                DcgmMessage(
                    text,
                    _int(w.get("error_id")),
                    _int(w.get("error_category")),
                    _int(w.get("error_severity")),
                )
            )
    return tuple(out)


def _info(result: dict) -> tuple[str, ...]:
    info = result.get("info")
    items = info if isinstance(info, list) else [info]
    return tuple(t for t in (_text(i) for i in items) if t)


def _entity(result: dict) -> str:
    group, eid = _text(result.get("entity_group")), result.get("entity_id")
    if group and _int(eid) is not None:
        return f"{group} {eid}"
    for key in ("gpu_id", "gpu_ids"):  # 3.x: "0" (a string) or 0; nvvs: "0,1,2,3"
        v = _text(result.get(key))
        if v:
            return f"GPU {v}"
    return ""


def parse_diag(text: str, level: int, rc: int = 0) -> DiagReport | Unavailable:
    """``dcgmi diag -j``'s answer (DCGM 3.x or 4.x) as test results; Unavailable when it is not DCGM's JSON."""
    doc = load_json(text)
    if isinstance(doc, str):
        return Unavailable(ERROR, doc)
    top = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(top, dict):
        return Unavailable(ERROR, "dcgmi's JSON has no 'DCGM Diagnostic' part")
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else doc
    version, driver = _text(meta.get("version")), _text(meta.get("Driver Version Detected"))
    runtime = _text(top.get("runtime_error"))
    results: list[DiagResult] = []
    dropped = 0
    cats = top.get("test_categories")
    for cat in cats if isinstance(cats, list) else ():
        if not isinstance(cat, dict):
            continue
        cname = _text(cat.get("category")) or "unnamed"
        tests = cat.get("tests")
        for test in tests if isinstance(tests, list) else ():
            if not isinstance(test, dict):
                continue
            tname = _text(test.get("name")) or "unnamed test"
            rows = test.get("results")
            found = []
            for r in rows if isinstance(rows, list) else ():
                if isinstance(r, dict) and len(results) + len(found) >= MAX_RESULTS:
                    dropped += 1
                elif isinstance(r, dict):
                    found.append(
                        DiagResult(cname, tname, _entity(r), _status(r.get("status")), _messages(r), _info(r))
                    )
            summary = test.get("test_summary")
            if isinstance(summary, dict):
                st = _status(summary.get("status"))
                # 4.x: errors of no entity (and the test's own verdict) are in the summary only.
                worse = st in (FAIL, WARN) and not any(f.status == st for f in found)
                if (worse or not found) and len(results) + len(found) < MAX_RESULTS:
                    found.append(DiagResult(cname, tname, "", st, _messages(summary), _info(summary)))
            results.extend(found)
    if not results and not runtime:
        return Unavailable(ERROR, "dcgmi's JSON holds no test result")
    return DiagReport(level, version, driver, tuple(results), runtime, rc, dropped)


def _value(node: Any) -> str:
    if not isinstance(node, dict):
        return ""
    parts = [_text(node.get("value"))]
    over = node.get("overflow")
    parts += [_text(o) for o in (over if isinstance(over, list) else ())]
    return " ".join(p for p in parts if p)[:MAX_TEXT]


def _children(node: Any) -> dict:
    kids = node.get("children") if isinstance(node, dict) else None
    return kids if isinstance(kids, dict) else {}


def parse_health(text: str) -> HealthReport | Unavailable:
    """``dcgmi health -c -j``'s answer; Unavailable (with the reason) when there is no report in it."""
    low = text.lower()
    if "health watches not enabled" in low:
        return Unavailable(NOT_FOUND, "no health watches are set on the host engine's GPU group")
    if "unable to establish a connection" in low or "unable to connect to host engine" in low:
        return Unavailable(NOT_FOUND, "no DCGM host engine answers (nv-hostengine is not running)")
    doc = load_json(text)
    if isinstance(doc, str):
        return Unavailable(ERROR, doc)
    body = doc.get("body")
    if not isinstance(body, dict) or "Overall Health" not in body:
        return Unavailable(ERROR, "dcgmi's health JSON has no 'Overall Health'")
    overall = _text(_value(body.get("Overall Health")).split(" ", maxsplit=1)[0]) or "unknown"
    incidents = []
    for group, gnode in body.items():
        if group == "Overall Health":
            continue
        for eid, enode in _children(gnode).items():
            errors = _children(enode).get("Errors")
            for system, snode in _children(errors).items():
                if len(incidents) >= MAX_RESULTS:
                    break
                words = _value(snode).split(" ", 1)
                health, msg = words[0], words[1] if len(words) > 1 else ""
                incidents.append(HealthIncident(f"{_text(group)} {_text(eid)}", _text(system), health, msg))
    return HealthReport(overall, tuple(incidents))


# --- running ----------------------------------------------------------------------------------------------------


def _why(done: CmdResult) -> str:
    said = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return f"exit status {done.rc}" + (f": {said[0][:MAX_TEXT]}" if said else "")


def run_diag(dcgmi: str, level: int, timeout: float, runner: Runner = run_cmd) -> DiagReport | Unavailable:
    # DCGM's own --timeout first (it then stops the diagnostic it launched, dcgmi/Diag.cpp); the kill at
    # ``timeout`` is the backstop for a dcgmi that hangs.
    own = max(1, int(timeout) - 5)
    done = runner([dcgmi, "diag", "-r", str(level), "-j", "--timeout", str(own)], timeout)
    if isinstance(done, Unavailable):
        return done
    got = parse_diag(done.stdout, level, done.rc)
    if isinstance(got, Unavailable) and done.rc != 0:
        return Unavailable(ERROR, f"dcgmi diag -r {level} failed ({_why(done)})")
    return got


def run_health(dcgmi: str, timeout: float, runner: Runner = run_cmd) -> HealthReport | Unavailable:
    done = runner([dcgmi, "health", "-c", "-j"], timeout)
    if isinstance(done, Unavailable):
        return done
    got = parse_health(done.stdout + "\n" + done.stderr)
    if isinstance(got, Unavailable) and got.kind == ERROR and done.rc != 0:
        return Unavailable(ERROR, f"dcgmi health -c failed ({_why(done)})")
    return got


def _bounded(runner: Runner | None) -> Runner:
    return runner or (lambda argv, timeout: run_cmd(argv, timeout, limit=MAX_OUTPUT))


def gather_dcgm(
    level: int,
    deadline: float | None = None,
    timeout_s: float = 60.0,
    busy: str | None = None,
    dcgmi: str | None = None,
    runner: Runner | None = None,
) -> DcgmSnapshot:
    """DCGM's health watches, and its diagnostic at ``level`` (0: none), each ended by ``deadline``
    (time.monotonic(), less :data:`DEADLINE_RESERVE_S`) or else ``timeout_s``. ``busy``: why the GPUs are not
    free (levels 2 and up load them: not run beside someone else's work)."""
    path = find_dcgmi(dcgmi)
    if path is None:
        return DcgmSnapshot(level=level)
    run = _bounded(runner)

    def left(cap: float) -> float:
        if deadline is None:
            return cap
        return min(cap, deadline - DEADLINE_RESERVE_S - time.monotonic())

    t = left(HEALTH_TIMEOUT_S)
    health = run_health(path, t, run) if t > 0 else Unavailable(TIMEOUT, "no time left in the run's deadline")
    diag: DiagReport | Unavailable | None = None
    if level > 0:
        t = left(timeout_s if deadline is None else float("inf"))
        if busy and level >= 2:
            diag = Unavailable(BUSY, f"not run beside other work: {busy}")
        elif t <= 1:
            diag = Unavailable(TIMEOUT, "no time left in the run's deadline for dcgmi diag")
        else:
            diag = run_diag(path, level, t, run)
    return DcgmSnapshot(dcgmi=path, level=level, diag=diag, health=health)


__all__ = [
    "DcgmMessage",
    "DcgmSnapshot",
    "DiagReport",
    "DiagResult",
    "HealthReport",
    "find_dcgmi",
    "gather_dcgm",
    "parse_diag",
    "parse_health",
]
