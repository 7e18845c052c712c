"""Local facts the roles leave in /etc/ansible/facts.d/<role>.fact (JSON; docs/design.md).

A fact file is read only when it is a regular file of sane size, and each key hostcheck uses is checked for its
type and range: a wrong value is dropped and reported (system.E004, naming file and key) while the other facts of
the file still count. A fact never crashes or misleads a check."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from hostcheck import infile
from hostcheck.gather.base import ERROR, Unavailable
from hostcheck.gather.pull import PullState, gather_pull

DEFAULT_FACTS_DIR = "/etc/ansible/facts.d"
ROLES = ("gpunode_tuning", "gpunode_driver", "gpunode_pytorch", "gpunode_cuda", "gpunode_pull")
#: The roles write a few KiB; anything past this is not one of their facts.
MAX_FACT_BYTES = 1 << 20


def _count(hi: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, str) and v.isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            return f"a whole number from 0 to {hi}"
        return None

    return check


def _flag(v: Any) -> str | None:
    ok = isinstance(v, bool) or (
        isinstance(v, str) and v.strip().lower() in ("true", "false", "yes", "no", "")
    )
    return None if ok else "true or false"


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) and "\0" not in v else "a string"


def _version(v: Any) -> str | None:
    """A version: a string, or the number a template engine may have made of one."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return None if math.isfinite(v) else "a version"
    return None if isinstance(v, str) and "\0" not in v else "a version"


def _path(v: Any) -> str | None:
    """An absolute path, or '' (none)."""
    ok = isinstance(v, str) and "\0" not in v and (v == "" or v.startswith("/"))
    return None if ok else "an absolute path"


def _texts(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, str) and "\0" not in x for x in v)
    return None if ok else "a list of strings"


def _paths(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, str) and "\0" not in x and x.startswith("/") for x in v)
    return None if ok else "a list of absolute paths"


def _mapping(v: Any) -> str | None:
    return None if isinstance(v, dict) else "a JSON object"


#: role -> key -> check (None when the value is fine, else what it should be). Only the keys hostcheck reads.
SCHEMA: dict[str, dict[str, Callable[[Any], str | None]]] = {
    "gpunode_driver": {
        "version": _version,
        "expected_gpu_count": _count(1024),
        "fabricmanager": _flag,
    },
    "gpunode_tuning": {
        "env_file": _path,
        "venv": _path,
        "services_disabled": _texts,
        "shm_size_bytes": _count(1 << 50),
        "omp_num_threads": _count(1 << 16),
        "numa_nodes": _count(1 << 12),
        "gpu_numa": _mapping,
        "limits": _mapping,
        "allocator": _text,
        "malloc_conf": _text,
        "pillow_simd": _flag,
        "pillow_simd_features": _texts,
        "cpu_governor": _text,
        "thp": _text,
        "data_dirs": _paths,
    },
    "gpunode_pytorch": {"venv": _path, "torch": _version},
    "gpunode_cuda": {"venv": _path},
    # Pull mode (roles/gpunode_pull): where its service writes each run's result, and the timer's interval.
    "gpunode_pull": {
        "result_file": _path,
        "interval_s": _count(1 << 31),
        "since": _count(1 << 40),
        "unit": _text,
    },
}


@dataclass(frozen=True)
class Facts:
    directory: str = DEFAULT_FACTS_DIR
    #: role -> parsed JSON object (wrong values dropped); a role without a usable fact file is absent.
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: role -> why its fact file could not be used.
    errors: dict[str, Unavailable] = field(default_factory=dict)
    #: "<file>: <key> is <value>, want <what>" for each value dropped.
    invalid: tuple[str, ...] = ()
    #: The last pull-mode run, where gpunode_pull's fact names its result file (system.E011); None: not set up.
    pull: PullState | None = None

    def get(self, role: str, key: str, default: Any = None) -> Any:
        return self.roles.get(role, {}).get(key, default)

    def has(self, role: str, key: str) -> bool:
        return key in self.roles.get(role, {})


def read_fact(path: str) -> str | Unavailable | None:
    """The text of a fact file; None when there is none. Read through the one reader (hostcheck.infile): a FIFO
    or device put in its place is reported, never waited on; a link is followed (the admin's), its target
    checked on the open descriptor."""
    try:
        return infile.read_text(path, MAX_FACT_BYTES)
    except infile.ReadError as exc:
        if exc.kind == infile.MISSING and not os.path.islink(path):
            return None
        if exc.kind == infile.NOT_TEXT:  # JSON is UTF-8 (RFC 8259)
            return Unavailable(ERROR, f"{path} is not JSON: {exc.why.removeprefix('is ')}")
        if exc.kind == infile.TOO_LARGE:
            return Unavailable(ERROR, f"{exc}: a gpunode fact is a few KiB")
        return Unavailable(ERROR, str(exc))


def validate(role: str, data: dict[str, Any], path: str) -> tuple[dict[str, Any], list[str]]:
    """The fact with its wrong values dropped, and what was dropped."""
    good, bad = dict(data), []
    for key, check in SCHEMA.get(role, {}).items():
        if key in good:
            want = check(good[key])
            if want:
                bad.append(f"{path}: {key} is {json.dumps(good.pop(key))[:80]}, want {want}")
    return good, bad


def gather_facts(directory: str = DEFAULT_FACTS_DIR) -> Facts:
    roles: dict[str, dict[str, Any]] = {}
    errors: dict[str, Unavailable] = {}
    invalid: list[str] = []
    for role in ROLES:
        path = os.path.join(directory, f"{role}.fact")
        text = read_fact(path)
        if text is None:
            continue
        if isinstance(text, Unavailable):
            errors[role] = text
            continue
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            errors[role] = Unavailable(ERROR, f"{path} is not JSON: {str(exc)[:120]}")
            continue
        if not isinstance(data, dict):
            errors[role] = Unavailable(ERROR, f"{path} is not a JSON object")
            continue
        roles[role], bad = validate(role, data, path)
        invalid += bad
    pull_fact = roles.get("gpunode_pull", {})
    pull = gather_pull(pull_fact) if pull_fact.get("result_file") else None
    return Facts(directory=directory, roles=roles, errors=errors, invalid=tuple(invalid), pull=pull)
