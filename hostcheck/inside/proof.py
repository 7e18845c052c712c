"""Did a run get the setting it was meant to measure? Pure checks of what the child reported.

Used twice: by the worker (fail fast, before it spends a measurement on the wrong setting) and by the orchestrator
on every record (hostcheck.bench.run). It runs in the training Python, so it lives in hostcheck.inside; pure and
standard library only, it is the one module of hostcheck.inside the orchestrator imports. An LD_PRELOAD path that
does not load only prints a warning, and a PYTHONPATH overlay can lose to an installed PIL; without these checks a
run would silently measure the baseline twice.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

ALLOCATORS = ("jemalloc", "tcmalloc", "tcmalloc_minimal")


def allocator_kind(path: str) -> str | None:
    base = os.path.basename(path)
    if "jemalloc" in base:
        return "jemalloc"
    if base.startswith("libtcmalloc_minimal"):
        return "tcmalloc_minimal"
    if base.startswith("libtcmalloc"):
        return "tcmalloc"
    return None


def mapped_allocators(paths: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in paths:
        kind = allocator_kind(p)
        if kind and p not in out.setdefault(kind, []):
            out[kind].append(p)
    return out


def _same_file(a: str, b: str) -> bool:
    if os.path.basename(a) == os.path.basename(b):
        return True
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def allocator_error(expect: str | None, path: str | None, mapped: Iterable[str]) -> str | None:
    """``expect``: "glibc", one of ALLOCATORS, or None (no claim); ``mapped``: paths in /proc/self/maps."""
    if not expect:
        return None
    kinds = mapped_allocators(mapped)
    found = sorted(p for ps in kinds.values() for p in ps)
    if expect == "glibc":
        if found:
            return (
                f"the glibc baseline has {', '.join(found)} mapped (from /etc/ld.so.preload?): "
                "there is no plain-malloc run to compare with"
            )
        return None
    hits = [p for p in kinds.get(expect, []) if not path or _same_file(p, path)]
    if not hits:
        return f"LD_PRELOAD path did not load: {path or expect} is not mapped in the child (/proc/self/maps)"
    others = [p for k, ps in kinds.items() if k != expect for p in ps]
    if others:
        return f"{expect} is mapped but so is {', '.join(others)} (from /etc/ld.so.preload?)"
    return None


def pil_identity(pil: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What tells two imported PILs apart: the package folder, the version and whether it is pillow-simd."""
    if not pil or not pil.get("version"):
        return None
    return (pil.get("path"), pil.get("version"), bool(pil.get("simd")))


def describe_pil(pil: dict[str, Any] | None) -> str:
    if not pil or not pil.get("version"):
        err = (pil or {}).get("error")
        return f"no PIL ({err})" if err else "no PIL"
    name = "pillow-simd" if pil.get("simd") else "Pillow"
    return f"{name} {pil['version']} from {pil.get('path') or '?'}"


def pil_error(expect: str | None, pil: dict[str, Any] | None) -> str | None:
    """``expect``: "pillow", "pillow-simd" or None."""
    if not expect:
        return None
    if not pil or not pil.get("version"):
        return f"expected {expect} but the child could not import PIL: {describe_pil(pil)}"
    got = "pillow-simd" if pil.get("simd") else "pillow"
    if got != expect:
        return (
            f"expected {expect} but the child imported {describe_pil(pil)} (the overlay did not take effect)"
        )
    return None


def same_pil_error(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    ia, ib = pil_identity(a), pil_identity(b)
    if ia is not None and ia == ib:
        return f"both sides imported the same PIL ({describe_pil(a)}): nothing to compare"
    return None


def check_record(expect: dict[str, Any] | None, rec: dict[str, Any]) -> str | None:
    """The first way a successful record contradicts its variant's expectations, or None."""
    expect = expect or {}
    alloc = rec.get("allocator") or {}
    err = allocator_error(expect.get("allocator"), expect.get("allocator_path"), alloc.get("mapped") or [])
    if err:
        return err
    if "malloc_conf" in expect and (alloc.get("malloc_conf") or "") != (expect["malloc_conf"] or ""):
        return f"MALLOC_CONF in the child is {alloc.get('malloc_conf')!r}, not {expect['malloc_conf']!r}"
    err = pil_error(expect.get("pil"), rec.get("pil"))
    if err:
        return err
    want = expect.get("threads")
    got = (rec.get("threads") or {}).get("torch")
    if want is not None and got is not None and int(got) != int(want):
        return f"OMP_NUM_THREADS={want} but torch runs {got} threads"
    cap = expect.get("shm_max_bytes")
    shm = rec.get("shm_bytes")
    if cap is not None and (shm is None or shm > cap):
        return f"/dev/shm in the child is {shm} bytes, not at most {cap}: the small tmpfs was not mounted"
    return None
