"""Host tunings the gpunode_tuning role makes: /dev/shm, allocators, numactl, governor, THP, limits, services."""

from __future__ import annotations

import glob
import os
import re
import resource
import shutil
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hostcheck.gather.base import (
    NOT_FOUND,
    NOT_SUPPORTED,
    CmdResult,
    Runner,
    Unavailable,
    read_text,
    run_cmd,
)

DEFAULT_ENV_FILE = "/etc/gpunode/training.env"
#: gpunode_tuning_services_disable's default; the role's fact lists what it disabled on the node.
DEFAULT_SERVICES_OFF = ("packagekit",)
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


@dataclass(frozen=True)
class ServiceState:
    name: str
    enabled: str  # systemctl is-enabled output: enabled, disabled, masked, not-found, ...
    active: str  # systemctl is-active output: active, inactive, failed, unknown, ...


@dataclass(frozen=True)
class TuningSnapshot:
    shm_bytes: int | Unavailable = 0
    env_file: str = DEFAULT_ENV_FILE
    env: dict[str, str] | Unavailable = field(default_factory=dict)
    #: allocator -> library paths installed on disk
    allocator_libs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    numactl: str | None = None
    governors: dict[str, int] | Unavailable = field(default_factory=dict)
    thp: str | Unavailable = ""
    #: hostcheck's own (soft, hard) limits; -1 = unlimited. The training Python's are in the torch probe.
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)
    services: tuple[ServiceState, ...] | Unavailable = ()
    #: What is wrong in the environment file (its bad lines are left out of ``env``).
    env_problems: tuple[str, ...] = ()


_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_file_entries(text: str) -> tuple[dict[str, str], list[str]]:
    """systemd EnvironmentFile= syntax: KEY=value, # comments, optional quotes; a leading 'export' tolerated.

    Returns the usable entries and what was wrong with the others (line number and why): a key that is not a
    variable name, a NUL byte (no process environment can carry one), a line that is not KEY=value. Bad lines
    are left out, so a child is never started with them."""
    out: dict[str, str] = {}
    problems: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if "\0" in line:
            problems.append(f"line {n}: a NUL byte")
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        if "=" not in line:
            problems.append(f"line {n}: not KEY=value")
            continue
        k, v = line.split("=", 1)
        k, v = k.strip(), v.strip()
        if not _ENV_KEY.fullmatch(k):
            problems.append(f"line {n}: {k[:40]!r} is not a variable name")
            continue
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            v = v[1:-1]
        out[k] = v
    return out, problems


def parse_env_file(text: str) -> dict[str, str]:
    """The usable entries of an environment file (env_file_entries without the problems)."""
    return env_file_entries(text)[0]


def parse_thp(text: str) -> str:
    for tok in text.split():
        if tok.startswith("[") and tok.endswith("]"):
            return tok[1:-1]
    return text.strip()


def shm_size(path: str = "/dev/shm") -> int | Unavailable:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Unavailable(NOT_FOUND, f"{path}: {exc}")
    return st.f_frsize * st.f_blocks


def find_allocator_libs(dirs: tuple[str, ...] = LIB_DIRS) -> dict[str, tuple[str, ...]]:
    found: dict[str, list[str]] = {"jemalloc": [], "tcmalloc": []}
    for d in dirs:
        for name in ("jemalloc", "tcmalloc"):
            for p in sorted(glob.glob(os.path.join(d, f"lib{name}*.so*"))):
                if p not in found[name]:
                    found[name].append(p)
    return {k: tuple(v) for k, v in found.items()}


def _limit(v: int) -> int:
    return -1 if v == resource.RLIM_INFINITY else int(v)


def services_state(
    names: tuple[str, ...], runner: Runner = run_cmd
) -> tuple[ServiceState, ...] | Unavailable:
    if shutil.which("systemctl") is None and runner is run_cmd:
        return Unavailable(NOT_SUPPORTED, "systemctl not found (no systemd)")
    out = []
    for name in names:
        en = runner(["systemctl", "is-enabled", name], 5)
        ac = runner(["systemctl", "is-active", name], 5)
        if isinstance(en, Unavailable):
            return en
        enabled = en.stdout.strip() or (
            "not-found" if "No such file" in en.stderr or en.rc == 4 else "unknown"
        )
        active = ac.stdout.strip() if isinstance(ac, CmdResult) else "unknown"
        out.append(ServiceState(name, enabled, active or "unknown"))
    return tuple(out)


def gather_tuning(
    env_file: str = DEFAULT_ENV_FILE,
    services: tuple[str, ...] = DEFAULT_SERVICES_OFF,
    runner: Runner = run_cmd,
) -> TuningSnapshot:
    env_text = read_text(env_file, strict=True)
    env: dict[str, str] | Unavailable = env_text
    env_problems: list[str] = []
    if isinstance(env_text, str):
        env, env_problems = env_file_entries(env_text)
    govs: Counter[str] = Counter()
    for p in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"):
        g = read_text(p)
        if isinstance(g, str):
            govs[g.strip()] += 1
    thp_text = read_text("/sys/kernel/mm/transparent_hugepage/enabled")
    rl: dict[str, Any] = {
        "memlock": tuple(_limit(x) for x in resource.getrlimit(resource.RLIMIT_MEMLOCK)),
        "nofile": tuple(_limit(x) for x in resource.getrlimit(resource.RLIMIT_NOFILE)),
    }
    return TuningSnapshot(
        shm_bytes=shm_size(),
        env_file=env_file,
        env=env,
        env_problems=tuple(env_problems),
        allocator_libs=find_allocator_libs(),
        numactl=shutil.which("numactl"),
        governors=dict(govs)
        if govs
        else Unavailable(NOT_SUPPORTED, "no cpufreq scaling_governor (VM or no frequency scaling driver)"),
        thp=parse_thp(thp_text) if isinstance(thp_text, str) else thp_text,
        rlimits=rl,
        services=services_state(services, runner),
    )
