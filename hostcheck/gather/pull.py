"""The last pull-mode run (roles/gpunode_pull): the result file the node's gpunode-pull.service writes after every
ansible-pull run, at the path the role's local fact names (docs/fleet.md, "Pull mode").

The file is root's, written atomically by the service, but read as any file hostcheck did not write: through the
one bounded reader, never through a link (the service replaces it by rename, so a link there is not its file), and
each field checked for its type before a check sees it. Parsing is pure: :func:`parse` takes the text and the time
it was read at.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from hostcheck import infile
from hostcheck.gather.base import ERROR, Unavailable, finite_number

#: The result is a few hundred bytes; past this it is not the service's.
MAX_RESULT_BYTES = 64 << 10
#: The result format the service writes (roles/gpunode_pull/files/gpunode-pull.py, SCHEMA_VERSION).
SCHEMA_VERSION = 1
DEFAULT_UNIT = "gpunode-pull.service"
#: Where the run stopped: before ansible-pull (ref), in its checkout, in the play, not run (unchanged), done, or
#: stopped by systemd.
STAGES = ("ref", "checkout", "playbook", "unchanged", "done", "stopped")


@dataclass(frozen=True)
class PullRun:
    """One run, as the service recorded it; ages are seconds before the file was read (never below 0)."""

    ok: bool
    stage: str
    rc: int | None
    ref: str
    commit: str
    message: str
    age_s: float
    #: Seconds since the last successful run ended; None: none recorded.
    success_age_s: float | None
    #: The play recap's counts for the node (ok, changed, failed, ...); None: no play ran.
    recap: dict[str, int] | None
    interval_s: int | None
    log: str


@dataclass(frozen=True)
class PullState:
    """What the role's fact points at: the result file and what was read from it."""

    path: str
    #: The last run; None: no run has finished yet (no file).
    run: PullRun | Unavailable | None
    #: Seconds since pull mode was set up (the fact's ``since``); None: not recorded.
    setup_age_s: float | None


def _text(data: dict[str, Any], key: str, cap: int) -> str | None:
    v = data.get(key, "")
    return v[:cap] if isinstance(v, str) and "\0" not in v else None


def parse(text: str, path: str, now: float) -> PullRun | Unavailable:
    """The run the result's text describes, or why it cannot be used (naming the file and the field)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Unavailable(ERROR, f"{path} is not JSON: {str(exc)[:120]}")
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return Unavailable(ERROR, f"{path} is not a gpunode pull result (schema_version {SCHEMA_VERSION})")
    bad = []
    ok = data.get("ok")
    if not isinstance(ok, bool):
        bad.append("ok")
    finished = finite_number(data.get("finished"), bools=False)
    if finished is None or finished <= 0:
        bad.append("finished")
    stage = data.get("stage")
    if stage not in STAGES:
        bad.append("stage")
    rc = data.get("rc")
    if rc is not None and (isinstance(rc, bool) or not isinstance(rc, int) or not -255 <= rc <= 255):
        bad.append("rc")
    last = data.get("last_success")
    last_at = finite_number(last, bools=False)
    if last is not None and last_at is None:
        bad.append("last_success")
    interval = data.get("interval_s")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0
    ):
        bad.append("interval_s")
    recap = data.get("recap")
    if recap is not None and not (
        isinstance(recap, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in recap.values())
    ):
        bad.append("recap")
    texts = {
        k: _text(data, k, cap) for k, cap in (("ref", 200), ("commit", 64), ("message", 500), ("log", 300))
    }
    bad += [k for k, v in texts.items() if v is None]
    if bad:
        return Unavailable(ERROR, f"{path}: wrong or missing {', '.join(bad)}")
    assert finished is not None
    return PullRun(
        ok=ok,
        stage=stage,
        rc=rc,
        ref=texts["ref"] or "",
        commit=texts["commit"] or "",
        message=texts["message"] or "",
        age_s=max(0.0, now - finished),
        success_age_s=None if last_at is None else max(0.0, now - last_at),
        recap={str(k)[:40]: v for k, v in recap.items()} if recap is not None else None,
        interval_s=interval,
        log=texts["log"] or "",
    )


def read_run(path: str, now: float | None = None) -> PullRun | Unavailable | None:
    """The run in ``path``; None when there is no file (no run has finished yet)."""
    now = time.time() if now is None else now
    try:
        text = infile.read_text(path, MAX_RESULT_BYTES, follow=False)
    except infile.ReadError as exc:
        if exc.kind == infile.MISSING:
            return None
        return Unavailable(ERROR, str(exc))
    return parse(text, path, now)


def gather_pull(fact: dict[str, Any], now: float | None = None) -> PullState:
    """The state the role's fact (already checked by hostcheck.gather.facts) points at."""
    now = time.time() if now is None else now
    path = fact["result_file"]
    since = finite_number(fact.get("since"), bools=False)
    return PullState(
        path=path,
        run=read_run(path, now),
        setup_age_s=None if since is None else max(0.0, now - since),
    )
