"""Gathering for the bench: allocator libraries, pillow wheels, mount-namespace rights, the training Python.

Every reader degrades to "not found" with a reason; the parsers are pure and tested from text.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
from collections.abc import Iterable

from hostcheck.bench.plan import DEFAULT_WHEEL_DIRS, SONAMES
from hostcheck.gather.base import CmdResult, Runner, read_text, run_cmd
from hostcheck.gather.tuning import find_allocator_libs

#: ldconfig's tag for the host's own ABI (a multiarch host also lists i386 libraries).
_LDCONFIG_ARCH = {"x86_64": "x86-64", "aarch64": "AArch64", "ppc64le": "64bit", "s390x": "64bit"}
CAP_SYS_ADMIN = 21


def parse_ldconfig(text: str, machine: str = "") -> dict[str, str]:
    """soname -> path from ``ldconfig -p``; an entry of the host's ABI wins over others of the same soname."""
    want = _LDCONFIG_ARCH.get(machine, "")
    out: dict[str, str] = {}
    native: set[str] = set()
    for line in text.splitlines():
        line = line.strip()
        if "=>" not in line or "(" not in line:
            continue
        left, path = line.split("=>", 1)
        soname = left.split("(", 1)[0].strip()
        flags = left.split("(", 1)[1]
        is_native = bool(want) and want in flags
        if soname not in out or (is_native and soname not in native):
            out[soname] = path.strip()
            if is_native:
                native.add(soname)
    return out


def find_allocators(machine: str = "", runner: Runner = run_cmd) -> dict[str, str | None]:
    """kind -> library path, from ``ldconfig -p`` (what the role uses), else the usual library folders."""
    table: dict[str, str] = {}
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        r = runner([exe, "-p"], 10)
        if isinstance(r, CmdResult) and r.rc == 0:
            table = parse_ldconfig(r.stdout, machine)
            break
    on_disk = [p for paths in find_allocator_libs().values() for p in paths]
    out: dict[str, str | None] = {}
    for kind, soname in SONAMES.items():
        out[kind] = table.get(soname) or next((p for p in on_disk if os.path.basename(p) == soname), None)
    return out


def find_wheels(
    paths: Iterable[str | None], default_dirs: Iterable[str] = DEFAULT_WHEEL_DIRS
) -> tuple[str, ...]:
    """Wheel files: explicit files, and *.whl in explicit and default folders and two levels below them
    (gpunode_tuning keeps one folder per version and build)."""
    out: list[str] = []
    for p in [*paths, *default_dirs]:
        if not p:
            continue
        if os.path.isfile(p):
            out.append(os.path.abspath(p))
        elif os.path.isdir(p):
            for pattern in ("*.whl", "*/*.whl", "*/*/*.whl"):
                out += sorted(glob.glob(os.path.join(os.path.abspath(p), pattern)))
    seen: set[str] = set()
    return tuple(x for x in out if not (x in seen or seen.add(x)))


def parse_cap_eff(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return None
    return None


def shm_capability(euid: int | None = None, status_text: str | None = None, unshare: str | None = None):
    """(ok, reason): can this process mount its own tmpfs on /dev/shm in a private mount namespace?"""
    euid = os.geteuid() if euid is None else euid
    if status_text is None:
        st = read_text("/proc/self/status")
        status_text = st if isinstance(st, str) else ""
    unshare = shutil.which("unshare") if unshare is None else unshare
    if not unshare:
        return False, "unshare (util-linux) is not installed"
    if euid != 0:
        return False, "needs root (a tmpfs over /dev/shm in a private mount namespace)"
    caps = parse_cap_eff(status_text)
    if caps is not None and not caps & (1 << CAP_SYS_ADMIN):
        return False, "root without CAP_SYS_ADMIN (a container without --cap-add SYS_ADMIN)"
    return True, ""


def os_family(os_release_text: str) -> str:
    ids: list[str] = []
    for line in os_release_text.splitlines():
        if line.startswith(("ID=", "ID_LIKE=")):
            ids += line.split("=", 1)[1].strip().strip('"').lower().split()
    if any(i in ("debian", "ubuntu") for i in ids):
        return "debian"
    if any(i in ("rhel", "fedora", "centos", "rocky", "almalinux") for i in ids):
        return "redhat"
    return ""


@functools.lru_cache(maxsize=8)
def avx2_instructions(so_path: str | None, runner: Runner = run_cmd) -> int | None:
    """ymm-register instructions in a shared object (thousands in an AVX2 build of PIL's _imaging, 0 in
    an SSE4 one); None when objdump is missing or fails."""
    if not so_path:
        return None
    r = runner(["objdump", "-d", "--no-show-raw-insn", so_path], 60)
    if not isinstance(r, CmdResult) or r.rc != 0:
        return None
    return sum(1 for line in r.stdout.splitlines() if "ymm" in line)
