"""What the measurements support, as gpunode_tuning inventory variables and DataLoader settings. Pure.

Rules (docs/bench.md, "Advice"): a tuning is advised only when its verdict is "helps" and, for the
allocator, it also hurts no workload measured; a measured harm is advised against (``none``, ``false``);
"no clear effect" and "too few pairs" give a note, not a variable. Every variable is checked against the
role's argument spec and assert rules (mirrored in ROLE_VARS; a test compares them with the role).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hostcheck.bench.plan import JEMALLOC_DECAY_CONF, JEMALLOC_GUIDE_CONF, SHM_SIZE_RE
from hostcheck.bench.run import FINDING, MEASURED, Comparison
from hostcheck.bench.stats import HELPS, HURTS, TOO_FEW, geomean

#: The role variables advice may name, with what roles/gpunode_tuning/meta/argument_specs.yml allows.
ROLE_VARS: dict[str, dict[str, Any]] = {
    "gpunode_tuning_allocator": {"type": "str", "choices": ("none", "tcmalloc", "jemalloc")},
    "gpunode_tuning_jemalloc_conf": {"type": "str"},
    "gpunode_tuning_pillow_simd_enabled": {"type": "bool"},
    "gpunode_tuning_omp_num_threads": {"type": "int"},
    "gpunode_tuning_threading_enabled": {"type": "bool"},
    "gpunode_tuning_shm_size": {"type": "str"},
}
#: allocator variant -> (gpunode_tuning_allocator, gpunode_tuning_jemalloc_conf). The role's "tcmalloc"
#: preloads libtcmalloc_minimal.so.4, so only that variant stands for it.
ALLOCATOR_CHOICES = {
    "jemalloc": ("jemalloc", ""),
    "jemalloc-guide": ("jemalloc", JEMALLOC_GUIDE_CONF),
    "jemalloc-decay": ("jemalloc", JEMALLOC_DECAY_CONF),
    "tcmalloc_minimal": ("tcmalloc", None),
}


@dataclass(frozen=True)
class Item:
    name: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "reason": self.reason}


@dataclass(frozen=True)
class Advice:
    role: tuple[Item, ...] = ()
    script: tuple[Item, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": [i.to_dict() for i in self.role],
            "script": [i.to_dict() for i in self.script],
            "notes": list(self.notes),
        }


def role_value_error(name: str, value: Any) -> str | None:
    """Why the role would reject ``name: value`` (argument spec and tasks/assert.yml), or None."""
    spec = ROLE_VARS.get(name)
    if spec is None:
        return f"{name} is not a gpunode_tuning variable the bench may set"
    t = spec["type"]
    if (t == "bool" and not isinstance(value, bool)) or (
        t == "int" and (isinstance(value, bool) or not isinstance(value, int))
    ):
        return f"{name} must be {t}"
    if t == "str" and not isinstance(value, str):
        return f"{name} must be a string"
    if "choices" in spec and value not in spec["choices"]:
        return f"{name} must be one of {', '.join(spec['choices'])}"
    if name == "gpunode_tuning_omp_num_threads" and value < 0:
        return f"{name} must be >= 0"
    if name == "gpunode_tuning_shm_size" and (
        not SHM_SIZE_RE.match(value) or (value.endswith("%") and not 1 <= int(value[:-1]) <= 100)
    ):
        return f"{name} must be like 64G, 512M or 1%-100%"
    if name == "gpunode_tuning_jemalloc_conf" and re.search(r'[\s"$`\\]', value):
        return f"{name} may not hold spaces, quotes, $, backquotes or backslashes"
    return None


def _figs(c: Comparison) -> str:
    s = c.summary
    ratio = f"{s.ratio:.2f}x" if s and s.ratio is not None else "n/a"
    return f"{ratio} on {c.title} ({c.verdict})"


def _fmt(c: Comparison) -> str:
    return f"{c.b.label} {_figs(c)}"


def _short(c: Comparison) -> str:
    s = c.summary
    ratio = f"{s.ratio:.2f}x" if s and s.ratio is not None else "n/a"
    return f"{ratio} {c.workload} ({c.verdict})"


def _solid(c: Comparison) -> bool:
    return c.status == MEASURED and c.summary is not None and not c.summary.noisy


def _measured(comps: Sequence[Comparison], tuning: str, workload: str | None = None) -> list[Comparison]:
    """The comparisons advice may rest on: measured, and not noisy."""
    return [c for c in comps if c.tuning == tuning and _solid(c) and workload in (None, c.workload)]


def advise(comps: Sequence[Comparison], shm_large: str = "50%", auto_threads: int | None = None) -> Advice:
    role: list[Item] = []
    script: list[Item] = []
    notes: list[str] = []
    _allocator(comps, role, notes)
    _pillow(comps, role, notes)
    _threads(comps, auto_threads, role, notes)
    _shm(comps, shm_large, role, notes)
    _dataloader(comps, script, notes)
    noisy = [c for c in comps if c.status == MEASURED and c.summary and c.summary.noisy]
    if noisy:
        notes.append(
            "not used for advice, the pairs spread too wide (a busy machine? re-run on an idle node): "
            + "; ".join(f"{c.tuning}: {_fmt(c)}" for c in noisy)
        )
    good = []
    for item in role:
        err = role_value_error(item.name, item.value)
        if err:  # never print what the role would refuse
            notes.append(f"not advised: {err}")
        else:
            good.append(item)
    return Advice(tuple(good), tuple(script), tuple(notes))


def _allocator(comps: Sequence[Comparison], role: list[Item], notes: list[str]) -> None:
    measured = _measured(comps, "allocator")
    if not measured:
        return
    if all(c.verdict == TOO_FEW for c in measured):
        notes.append("allocator: too few pairs to advise (run with --pairs 5 or more)")
        return
    workloads = {c.workload for c in measured}
    by_variant: dict[str, list[Comparison]] = {}
    for c in measured:
        by_variant.setdefault(c.b.key, []).append(c)
    ok = []
    for key, (value, conf) in ALLOCATOR_CHOICES.items():
        cs = by_variant.get(key, [])
        verdicts = [c.verdict for c in cs]
        if {c.workload for c in cs} != workloads or HURTS in verdicts or TOO_FEW in verdicts:
            continue
        if HELPS in verdicts:
            ok.append((geomean([c.summary.ratio for c in cs if c.summary]), key, value, conf, cs))
    if ok:
        _, key, value, conf, cs = max(ok, key=lambda t: t[0])
        why = f"{cs[0].b.label}: " + "; ".join(_figs(c) for c in cs) + "; hurting nothing measured"
        role.append(Item("gpunode_tuning_allocator", value, why))
        if value == "jemalloc":
            role.append(
                Item(
                    "gpunode_tuning_jemalloc_conf", conf or "", f"the best jemalloc setting measured ({key})"
                )
            )
    else:
        per = "; ".join(f"{cs[0].b.label}: " + ", ".join(_short(c) for c in cs) for cs in by_variant.values())
        role.append(Item("gpunode_tuning_allocator", "none", f"no allocator helped without hurting: {per}"))
    full = by_variant.get("tcmalloc", [])
    if full and any(c.verdict == HELPS for c in full) and not any(c.verdict == HURTS for c in full):
        notes.append(
            "gperftools' full tcmalloc helped ("
            + "; ".join(_fmt(c) for c in full)
            + "), but the role's tcmalloc is libtcmalloc_minimal; preload the full one in your job's own launcher"
        )


def _pillow(comps: Sequence[Comparison], role: list[Item], notes: list[str]) -> None:
    measured = _measured(comps, "pillow")
    if not measured:
        return
    verdicts = [c.verdict for c in measured]
    why = "pillow-simd vs Pillow: " + "; ".join(_figs(c) for c in measured)
    if HURTS in verdicts:
        role.append(Item("gpunode_tuning_pillow_simd_enabled", False, why))
    elif HELPS in verdicts:
        role.append(Item("gpunode_tuning_pillow_simd_enabled", True, why))
    else:
        notes.append(f"pillow-simd: nothing to change ({why})")


def _threads(comps: Sequence[Comparison], auto: int | None, role: list[Item], notes: list[str]) -> None:
    measured = _measured(comps, "threads")
    if not measured:
        return
    for c in measured:
        if c.verdict == HURTS:
            notes.append(f"do not set {c.b.label} here: {_fmt(c)} vs {c.a.label}")
    helping = [c for c in measured if c.verdict == HELPS and c.summary and c.summary.ratio]
    if helping:
        best = max(helping, key=lambda c: c.summary.ratio)  # type: ignore[union-attr]
        n = int(best.b.key.split("-", 1)[1])
        role.append(Item("gpunode_tuning_omp_num_threads", n, _fmt(best) + " vs torch's default"))
        return
    auto_c = next((c for c in measured if auto is not None and c.b.key == f"omp-{auto}"), None)
    if auto_c is None or auto_c.verdict == TOO_FEW:
        rest = [c for c in measured if c.verdict != HURTS]
        if rest:
            notes.append("threads: no setting helped: " + "; ".join(_fmt(c) for c in rest))
        return
    if auto_c.verdict == HURTS:
        role.append(
            Item(
                "gpunode_tuning_threading_enabled",
                False,
                f"the role's automatic value hurts: {_fmt(auto_c)}; torch's default was best",
            )
        )
        return
    role.append(
        Item(
            "gpunode_tuning_omp_num_threads",
            0,
            f"0 = automatic ({auto} here, physical cores per GPU): {_fmt(auto_c)} vs torch's default",
        )
    )


def _shm(comps: Sequence[Comparison], large: str, role: list[Item], notes: list[str]) -> None:
    cs = [c for c in comps if c.tuning == "shm" and c.status in (MEASURED, FINDING)]
    for c in cs:
        if c.status == FINDING and c.verdict == HELPS:
            # "<finding>: <first line> ... <last line>": the finding and the error's last line.
            finding, _, err = c.message.partition(": ")
            role.append(Item("gpunode_tuning_shm_size", large, f"{finding}: {err.rpartition(' ... ')[2]}"))
        elif c.verdict == HELPS:
            role.append(Item("gpunode_tuning_shm_size", large, _fmt(c) + f" vs {c.a.label}"))
        else:
            notes.append(f"/dev/shm: {c.a.label} was enough for this workload ({_fmt(c)})")


def _dataloader(comps: Sequence[Comparison], script: list[Item], notes: list[str]) -> None:
    pipe = _measured(comps, "workers", "pipeline")
    helping = [c for c in pipe if c.verdict == HELPS and c.summary and c.summary.ratio]
    if helping:
        top = max(c.summary.ratio for c in helping)  # type: ignore[union-attr]
        # The fewest workers within 3 % of the best: more would only take cores from the model.
        enough = [c for c in helping if c.summary.ratio >= 0.97 * top]  # type: ignore[union-attr]
        best = min(enough, key=lambda c: int(c.b.key[1:]))
        script.append(Item("num_workers", int(best.b.key[1:]), "; ".join(_fmt(c) for c in pipe)))
    elif pipe and not all(c.verdict == TOO_FEW for c in pipe):
        script.append(Item("num_workers", 0, "no worker count helped: " + "; ".join(_fmt(c) for c in pipe)))
    for c in _measured(comps, "workers", "e2e"):
        if c.verdict == HURTS:
            notes.append(
                f"with a model training on the same cores, {_fmt(c)}: the workers compete with the model's "
                "threads; use fewer workers when the model trains on the CPU"
            )
        elif c.verdict == HELPS:
            notes.append(f"with a model training in the same process, {_fmt(c)}")
    for tuning, name in (("persistent_workers", "persistent_workers"), ("pin_memory", "pin_memory")):
        for c in _measured(comps, tuning):
            if c.verdict in (HELPS, HURTS):
                script.append(Item(name, c.verdict == HELPS, _fmt(c)))
            else:
                notes.append(f"{name}: {_fmt(c)}")


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a valid YAML double-quoted scalar


def render_advice(advice: Advice, header: str = "") -> str:
    """Inventory YAML, valid and yamllint-clean as is (a group_vars file can take it whole), with the measured
    reasons as comments above each variable, then DataLoader advice as comments."""
    lines = ["---"]
    if header:
        for h in header.splitlines():
            lines += _comment(h)
    if advice.role:
        lines.append("# gpunode_tuning inventory variables (host_vars/<node>.yml or group_vars/<group>.yml):")
        for i in advice.role:
            lines += _comment(i.reason)
            lines.append(f"{i.name}: {_yaml(i.value)}")
    else:
        lines.append("# No gpunode_tuning variable is supported by these measurements.")
    if advice.script:
        args = ", ".join(f"{i.name}={i.value!r}" for i in advice.script)
        lines.append("# For training scripts (not role variables):")
        lines.append(f"#   DataLoader(..., {args})")
        for i in advice.script:
            lines += _comment(f"{i.name}={i.value!r}: {i.reason}", "#     ")
    if advice.notes:
        lines.append("# Notes:")
        for n in advice.notes:
            lines += _comment(n, "#   ")
    return "\n".join(lines) + "\n"


def _comment(text: str, indent: str = "# ") -> list[str]:
    """A comment wrapped to 118 columns, continuation lines indented two more."""
    return textwrap.wrap(
        _oneline(text),
        width=118,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
    ) or [indent.rstrip()]


def _oneline(s: str) -> str:
    return " ".join(str(s).split())
