"""Host tuning checks, one per tuning gpunode_tuning makes; where the role left a local fact, its intent is
compared with reality (a mismatch is a fail: something undid the tuning)."""

from __future__ import annotations

from typing import Any

from hostcheck import fixes
from hostcheck.checks.gpu import _config
from hostcheck.checks.torch import probe_unavailable
from hostcheck.gather.base import Unavailable
from hostcheck.registry import Outcome, check, failed, passed, skipped, warned

GiB = 1 << 30
TF = "gpunode_tuning"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _size_arg(n: int) -> str:
    return f"{max(1, round(n / GiB))}G"


_probe = probe_unavailable


def _as_int(v: Any) -> int | None:
    """Fact values may arrive as strings ("14") from templating."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _as_bool(v: Any) -> bool | None:
    if v is None or v == "":
        return None
    if isinstance(v, str):
        return v.strip().lower() in ("true", "yes", "1", "on")
    return bool(v)


def _fact_limits(s: Any) -> dict[str, Any]:
    v = s.facts.get(TF, "limits")
    return v if isinstance(v, dict) else {}


def _n_gpus(s: Any) -> int:
    if s.nvml is not None and s.nvml.ok and s.nvml.gpus:
        return len(s.nvml.gpus)
    if s.options.expect_gpus:
        return s.options.expect_gpus
    return int(s.facts.get("gpunode_driver", "expected_gpu_count") or 1) or 1


def _runtime_owns(s: Any, variable: str, skipped: str) -> bool:
    """Inside a container, with gpunode_tuning's ``variable`` at its default (as the fact recorded it, or not run):
    re-running the role cannot change the finding, the container runtime's setting can. Also where the role's fact
    says it skipped the knob (``skipped``: no CAP_SYS_ADMIN to remount, PID 1's hard limits)."""
    if not (s.system and s.system.container):
        return False
    left = s.facts.get(TF, "skipped")
    if isinstance(left, dict) and left.get(skipped):
        return True
    if variable == "shm_size":
        value = s.facts.get(TF, "shm_size_target")
    else:
        value = _fact_limits(s).get(variable.removeprefix("limits_"))
    default = fixes.TUNING_DEFAULTS[variable]
    return value in (None, "") or str(value) == str(default)


@check("tuning.E001", "/dev/shm size", weight=5, needs=("tuning", "system", "facts"))
def shm(s: Any) -> Outcome:
    size = s.tuning.shm_bytes
    if isinstance(size, Unavailable):
        return failed(f"/dev/shm: {size.reason}", hint=fixes.SHM.format(size="64G"))
    intent = s.facts.get(TF, "shm_size_bytes")
    mem = s.system.mem_total_bytes if s.system else 0
    kw: dict[str, Any] = {"value": size, "unit": "bytes"}
    th = _config(s).thresholds
    runtime = _runtime_owns(s, "shm_size", "shm_remount")
    container = s.system.container if s.system else None

    def fix(target: int) -> str:
        if runtime:
            return fixes.RUNTIME_SHM.format(size=_size_arg(target).lower(), k8s=_size_arg(target) + "i")
        hint = fixes.SHM.format(size=_size_arg(target))
        if container:
            hint += f"; in a container: --shm-size={_size_arg(target).lower()} or --ipc=host"
        return hint

    if _as_int(intent):
        target = int(intent)
        hint = fix(target)
        if size < th.shm_target_slack * target:
            return failed(
                f"/dev/shm is {_human(size)}, gpunode_tuning set {_human(target)}",
                expected=target,
                hint=hint,
                **kw,
            )
        return passed(f"/dev/shm {_human(size)} (target {_human(target)})", expected=target, **kw)
    target = min(th.shm_default_target_bytes, mem // 2) if mem else th.shm_default_target_bytes
    hint = fix(target)
    if size <= th.shm_floor_bytes:
        return failed(
            f"/dev/shm is only {_human(size)}: DataLoader workers will die with 'bus error'",
            expected=target,
            hint=hint,
            **kw,
        )
    if size < th.shm_target_slack * target:
        return warned(f"/dev/shm {_human(size)} < {_human(target)}", expected=target, hint=hint, **kw)
    return passed(f"/dev/shm {_human(size)}", expected=target, **kw)


def loaded_allocator(s: Any) -> tuple[str | None, str]:
    maps = s.torch.maps
    sym = s.torch.data.get("symbols") or {}
    for name in ("tcmalloc", "jemalloc"):
        if maps.get(name):
            return name, maps[name][0]
    if sym.get("mallctl"):
        return "jemalloc", "linked in"
    if sym.get("tc_malloc"):
        return "tcmalloc", "linked in"
    return None, ""


def _allocator_named(entry: str) -> str | None:
    base = entry.rsplit("/", 1)[-1]
    return next((k for k in ("jemalloc", "tcmalloc") if k in base), None)


def broken_preloads(s: Any) -> list[tuple[str, str]]:
    """(entry, why) for each LD_PRELOAD entry of the training environment that did not load: ld.so skips a
    library it cannot open with only a warning, and the job runs without it."""
    rows = s.torch.data.get("preload")
    if isinstance(rows, list):
        return [
            (str(r.get("entry"))[:300], "does not exist" if r.get("exists") is False else "did not load")
            for r in rows
            if isinstance(r, dict) and r.get("loaded") is False
        ]
    # A probe from before the per-entry list: an allocator named in LD_PRELOAD but not mapped did not load.
    entries = str(s.torch.env.get("LD_PRELOAD") or "").replace(":", " ").split()
    loaded = loaded_allocator(s)[0]
    return [
        (e[:300], "did not load")
        for e in entries
        if _allocator_named(e) and _allocator_named(e) != loaded and not s.torch.maps.get(_allocator_named(e))
    ]


def _preload_fix(s: Any, broken: list[tuple[str, str]]) -> str:
    installed = {k: v for k, v in (s.tuning.allocator_libs or {}).items() if v}
    where = [
        f"{kind} is installed at {installed[kind][0]}"
        for kind in dict.fromkeys(_allocator_named(entry[0]) for entry in broken)
        if kind and installed.get(kind)
    ]
    return (
        f"fix the path in {s.env_file}"
        + (f" ({'; '.join(where)})" if where else "")
        + " or remove the entry; "
        + fixes.rerun(fixes.TUNING, "allocator")
    )


@check(
    "tuning.E002",
    "Allocator loaded by the training environment",
    weight=3,
    needs=("torch", "tuning", "facts"),
)
def allocator(s: Any) -> Outcome:
    early = _probe(s)
    if early:
        return early
    intent = s.facts.get(TF, "allocator")
    loaded, path = loaded_allocator(s)
    env = s.torch.env
    preload = env.get("LD_PRELOAD", "")
    conf = env.get("MALLOC_CONF", "")
    installed = {k: v for k, v in (s.tuning.allocator_libs or {}).items() if v}
    value = loaded or "glibc"
    broken = broken_preloads(s)
    if broken:  # whatever the fact says: a preload that names a missing file is a mistake
        return failed(
            f"LD_PRELOAD in the training environment ({s.env_file}) names "
            + ", ".join(f"{e} ({why})" for e, why in broken)
            + ": ld.so skips it with only a warning and the job runs without it",
            value=value,
            expected="every LD_PRELOAD entry loaded",
            hint=_preload_fix(s, broken),
        )
    kw: dict[str, Any] = {"value": value, "expected": intent or "tcmalloc"}
    if intent == "none":
        if loaded:
            return warned(
                f"{loaded} is loaded ({path}) though gpunode_tuning chose none",
                hint=f"remove LD_PRELOAD from {s.env_file}; " + fixes.rerun(fixes.TUNING, "allocator"),
                **kw,
            )
        return passed("glibc malloc, as gpunode_tuning chose", **kw)
    if loaded:
        if intent and loaded != intent:
            return failed(
                f"{loaded} loaded but gpunode_tuning set {intent}",
                hint=fixes.rerun(fixes.TUNING, "allocator"),
                **kw,
            )
        want_conf = s.facts.get(TF, "malloc_conf")
        if want_conf and conf != want_conf:
            return failed(
                f"MALLOC_CONF={conf!r} but gpunode_tuning set {want_conf!r}",
                hint=fixes.rerun(fixes.TUNING, "allocator"),
                **kw,
            )
        if loaded == "jemalloc" and not conf:
            return warned(
                "jemalloc with default settings: measured 0.66-0.79x (slower) on training and input pipelines",
                hint=fixes.MALLOC_CONF + " or switch: " + fixes.ALLOCATOR,
                **kw,
            )
        return passed(f"{loaded} loaded ({path})" + (f", MALLOC_CONF={conf}" if conf else ""), **kw)
    want = intent or "tcmalloc"
    if preload:
        why = f"LD_PRELOAD={preload} did not load it (wrong path?)"
    elif installed.get(want):
        why = f"{want} is installed ({installed[want][0]}) but not preloaded by {s.env_file}"
    else:
        why = f"{want} is not installed"
    msg = f"no {want} in the training environment: {why}"
    if intent:
        return failed(msg, hint=fixes.rerun(fixes.TUNING, "allocator"), **kw)
    if preload:
        return warned(msg, hint=fixes.ALLOCATOR, **kw)
    # No intent recorded and nothing preloaded: glibc is the measured-safe default (tcmalloc 0.96-0.97x on
    # a JPEG pipeline, 1.06x on a training step; jemalloc at defaults 0.66-0.79x), so it is not a finding.
    return passed(
        "glibc malloc; no allocator preloaded (measured: tcmalloc 0.96x input pipeline / 1.06x training step, "
        "jemalloc at defaults slower): measure before preloading one",
        **{**kw, "expected": "glibc or a measured choice"},
    )


@check("tuning.E003", "pillow-simd in the training Python", weight=2, needs=("torch", "facts"))
def pillow_simd(s: Any) -> Outcome:
    early = _probe(s)
    if early:
        return early
    p = s.torch.pillow
    intent = _as_bool(s.facts.get(TF, "pillow_simd"))
    simd, pil = p.get("pillow-simd"), p.get("PIL")
    value = (
        f"PIL {pil or 'none'}"
        + (f", pillow-simd {simd}" if simd else "")
        + (f", Pillow {p.get('Pillow')}" if p.get("Pillow") else "")
    )
    kw: dict[str, Any] = {"value": value, "expected": "PIL from pillow-simd"}
    if simd and pil == simd:
        return _pillow_simd_features(s, simd, p.get("features"), kw)
    if simd and pil != simd:
        return failed(
            f"pillow-simd {simd} is installed but PIL is {pil or 'missing'}: stock Pillow overwrote it",
            hint=fixes.PILLOW_SIMD_REINSTALL.format(python=s.torch.python),
            **kw,
        )
    if not pil and not simd and not p.get("Pillow"):
        msg = "no PIL in the training Python (neither Pillow nor pillow-simd installed)"
        if intent:
            return failed("gpunode_tuning installed pillow-simd but " + msg, hint=fixes.PILLOW_SIMD, **kw)
        return warned(msg, hint=fixes.PILLOW_SIMD, **kw)
    if intent is False:
        return passed(f"{value}; gpunode_tuning left pillow-simd off", **kw)
    msg = f"stock Pillow {pil} (no pillow-simd): resize is 5-6x slower (input pipeline measured 1.27-1.36x)"
    if intent:
        return failed("gpunode_tuning installed pillow-simd but " + msg, hint=fixes.PILLOW_SIMD, **kw)
    return warned(msg, hint=fixes.PILLOW_SIMD, **kw)


def _pillow_simd_features(s: Any, simd: str, have: Any, kw: dict[str, Any]) -> Outcome:
    """pillow-simd is in place; does it open what stock Pillow opens? The role's fact names what it promised."""
    if not isinstance(have, dict):  # a probe that could not ask PIL.features
        return passed(f"pillow-simd {simd} is the imported PIL", **kw)
    promised = s.facts.get(TF, "pillow_simd_features")
    # Without a promise: every format the probe asked PIL about (stock Pillow's wheel has them all).
    wanted = promised if isinstance(promised, list) else list(have)
    missing = [f for f in wanted if have.get(f) is False]
    if not missing:
        return passed(
            f"pillow-simd {simd} is the imported PIL, with {', '.join(wanted) or 'JPEG and zlib'}", **kw
        )
    msg = (
        f"pillow-simd {simd} is the imported PIL but was built without {', '.join(missing)}: "
        "images or fonts that stock Pillow opens fail to load"
    )
    kw = {**kw, "value": f"{kw['value']}; missing {', '.join(missing)}"}
    if isinstance(promised, list):
        return failed(
            msg + " (gpunode_tuning_pillow_simd_features lists them)", hint=fixes.PILLOW_SIMD_FEATURES, **kw
        )
    return warned(msg, hint=fixes.PILLOW_SIMD_FEATURES, **kw)


@check(
    "tuning.E004", "numactl and GPU-to-NUMA affinity", weight=2, needs=("tuning", "system", "nvml", "facts")
)
def numa(s: Any) -> Outcome:
    nodes = len(s.system.numa_nodes) or 1
    gpus = s.nvml.gpus if s.nvml is not None and s.nvml.ok else ()
    mapping = {g.pci_bus_id: g.numa_node for g in gpus if isinstance(g.pci_bus_id, str)}
    value = f"{nodes} NUMA node(s)" + (
        ", GPU nodes " + ",".join(str(v) if isinstance(v, int) else "?" for v in mapping.values())
        if mapping
        else ""
    )
    if not s.tuning.numactl:
        return warned(f"numactl not installed ({value})", value=value, hint=fixes.NUMA)
    intent = s.facts.get(TF, "gpu_numa")
    intent = intent if isinstance(intent, dict) else {}
    wrong = []
    for bus, want in intent.items():  # -1 means "no NUMA information" on either side: nothing to compare
        have, want_i = mapping.get(bus), _as_int(want)
        if isinstance(have, int) and have >= 0 and want_i is not None and want_i >= 0 and have != want_i:
            wrong.append(f"{bus}: node {have} (fact {want_i})")
    want_nodes = _as_int(s.facts.get(TF, "numa_nodes"))
    if want_nodes and want_nodes != nodes:
        wrong.insert(0, f"{nodes} NUMA nodes (fact {want_nodes})")
    if wrong:
        return failed(
            "GPU NUMA placement differs from gpunode_tuning's facts: " + "; ".join(wrong),
            value=value,
            hint="GPUs moved slots or BIOS NUMA settings changed: " + fixes.rerun(fixes.TUNING, "numa"),
        )
    if nodes > 1:
        unknown = [bus for bus, v in mapping.items() if not isinstance(v, int) or v < 0]
        if unknown:
            return warned(
                f"{nodes} NUMA nodes but no NUMA node known for {', '.join(unknown)}",
                value=value,
                hint="enable NUMA/ACPI SRAT reporting in the BIOS so launchers can bind each rank near its GPU",
            )
    return passed(f"numactl at {s.tuning.numactl}; {value}", value=value)


@check(
    "tuning.E005",
    "CPU threads per GPU (OMP_NUM_THREADS, affinity)",
    weight=5,
    needs=("torch", "system", "nvml", "facts"),
)
def threads(s: Any) -> Outcome:
    early = _probe(s)
    if early:
        return early
    sysm = s.system
    gpus = _n_gpus(s)
    cores = sysm.physical_cores or sysm.logical_cpus or 1
    aff = s.torch.data.get("affinity")
    if aff and sysm.logical_cpus and aff < sysm.logical_cpus:
        cores = max(1, cores * aff // sysm.logical_cpus)
    budget = max(1, cores // gpus)
    raw = s.torch.env.get("OMP_NUM_THREADS")
    intent = s.facts.get(TF, "omp_num_threads")
    hint = fixes.THREADS.format(n=budget)
    kw: dict[str, Any] = {"unit": "threads/GPU", "expected": f"<= {budget} ({cores} cores / {gpus} GPUs)"}
    if raw is None:
        torch_default = s.torch.torch.get("num_threads") or cores
        kw["value"] = torch_default
        if gpus > 1:
            return warned(
                f"OMP_NUM_THREADS unset: torchrun forces 1 thread per rank (slow), plain launches of {gpus} "
                f"ranks x {torch_default} threads oversubscribe {cores} cores",
                hint=hint,
                **kw,
            )
        return passed(f"OMP_NUM_THREADS unset; torch uses {torch_default} threads on {cores} cores", **kw)
    try:
        n = int(raw)
    except ValueError:
        return failed(
            f"OMP_NUM_THREADS={raw!r} is not a number",
            value=raw,
            hint=hint,
            **{k: kw[k] for k in ("expected",)},
        )
    kw["value"] = n
    if n < 1:
        return failed(f"OMP_NUM_THREADS={n} is not a thread count (OpenMP wants 1 or more)", hint=hint, **kw)
    if _as_int(intent) and _as_int(intent) != n:
        return failed(
            f"OMP_NUM_THREADS={n} but gpunode_tuning set {intent}",
            hint=fixes.rerun(fixes.TUNING, "threading"),
            **kw,
        )
    if n * gpus > cores:
        return failed(
            f"oversubscribed: {gpus} ranks x {n} threads = {n * gpus} > {cores} physical cores",
            hint=hint,
            **kw,
        )
    # int() rounds the share down to whole threads, as budget // 2 did for the shipped 0.5.
    if n < int(budget * _config(s).thresholds.omp_threads_idle_warn_fraction):
        return warned(
            f"{n} threads per rank leaves {cores - n * gpus} of {cores} cores idle (OMP_NUM_THREADS=1 measured 0.56x)",
            hint=hint,
            **kw,
        )
    omp_libs = " ".join(s.torch.maps.get("openmp") or [])
    kmp = [k for k in ("KMP_AFFINITY", "KMP_BLOCKTIME") if k in s.torch.env]
    if kmp and "libgomp" in omp_libs and "libiomp" not in omp_libs:
        return warned(
            f"{', '.join(kmp)} set, but torch uses GNU OpenMP (libgomp), which ignores KMP_* variables",
            hint="use GOMP_CPU_AFFINITY / OMP_PROC_BIND instead: set gpunode_tuning_gomp_cpu_affinity "
            "(role gpunode_tuning) and re-run playbooks/site.yml --tags threading",
            **kw,
        )
    return passed(f"{gpus} ranks x {n} threads on {cores} physical cores", **kw)


@check("tuning.E006", "Services that should be off", weight=1, needs=("tuning", "facts"))
def services(s: Any) -> Outcome:
    st = s.tuning.services
    if isinstance(st, Unavailable):
        return skipped(st.reason)
    intent = s.facts.has(TF, "services_disabled")
    on = [
        x for x in st if x.active in ("active", "activating") or x.enabled in ("enabled", "enabled-runtime")
    ]
    value = ", ".join(f"{x.name}={x.active}/{x.enabled}" for x in st) or "none checked"
    if not on:
        return passed(
            f"off: {', '.join(x.name for x in st) or 'none listed'}",
            value=value,
            expected="inactive, disabled",
        )
    names = ", ".join(x.name for x in on)
    hint = fixes.SERVICES.format(names=", ".join(x.name for x in st))
    if intent:
        return failed(f"gpunode_tuning disabled them but these are on again: {names}", value=value, hint=hint)
    return warned(f"running or enabled: {names}", value=value, expected="inactive, disabled", hint=hint)


@check("tuning.E007", "CPU frequency governor", weight=2, needs=("tuning", "facts"))
def governor(s: Any) -> Outcome:
    g = s.tuning.governors
    if isinstance(g, Unavailable):
        return skipped(g.reason)
    intent = s.facts.get(TF, "cpu_governor")
    want = intent or "performance"
    value = ", ".join(f"{k} x{v}" for k, v in sorted(g.items()))
    if set(g) == {want}:
        return passed(f"{want} on all {sum(g.values())} CPUs", value=value, expected=want)
    if intent:
        return failed(
            f"governor {value}, gpunode_tuning set {intent}", value=value, expected=want, hint=fixes.GOVERNOR
        )
    return warned(f"governor {value}", value=value, expected=want, hint=fixes.GOVERNOR)


@check("tuning.E008", "Transparent hugepages", weight=1, needs=("tuning", "facts"))
def thp(s: Any) -> Outcome:
    v = s.tuning.thp
    if isinstance(v, Unavailable):
        return skipped(v.reason)
    intent = s.facts.get(TF, "thp")
    if intent:
        if v != intent:
            return failed(f"THP {v}, gpunode_tuning set {intent}", value=v, expected=intent, hint=fixes.THP)
        return passed(f"THP {v}, as set", value=v, expected=intent)
    if v == "never":
        return warned(
            "THP never: large tensors lose hugepage TLB benefits",
            value=v,
            expected="madvise or always",
            hint=fixes.THP,
        )
    return passed(f"THP {v}", value=v, expected="madvise or always")


def _limits(s: Any, name: str) -> tuple[int, int] | None:
    lim = (
        (s.torch.data.get("rlimits") or {}).get(name)
        if s.torch is not None and s.torch.error is None
        else None
    )
    if lim:
        return int(lim[0]), int(lim[1])
    own = s.tuning.rlimits.get(name) if s.tuning is not None else None
    return (int(own[0]), int(own[1])) if own else None


@check("tuning.E009", "Locked-memory limit (memlock)", weight=2, needs=("tuning", "torch", "facts"))
def memlock(s: Any) -> Outcome:
    lim = _limits(s, "memlock")
    if lim is None:
        return skipped("limits not read")
    soft = lim[0]
    value = "unlimited" if soft < 0 else soft
    if soft < 0:
        return passed("memlock unlimited", value=value, expected="unlimited")
    out = failed if str(_fact_limits(s).get("memlock", "")) == "unlimited" else warned
    return out(
        f"memlock soft limit {_human(soft)}: pinned host memory and NCCL over RDMA need it unlimited",
        value=value,
        unit="bytes",
        expected="unlimited",
        hint=fixes.RUNTIME_MEMLOCK if _runtime_owns(s, "limits_memlock", "limits") else fixes.MEMLOCK,
    )


@check("tuning.E010", "Open-files limit (nofile)", weight=1, needs=("tuning", "torch", "facts"))
def nofile(s: Any) -> Outcome:
    lim = _limits(s, "nofile")
    if lim is None:
        return skipped("limits not read")
    soft = lim[0]
    want = _as_int(_fact_limits(s).get("nofile"))
    floor = want or _config(s).thresholds.nofile_min
    if soft < 0 or soft >= floor:
        return passed(f"nofile {soft if soft >= 0 else 'unlimited'}", value=soft, expected=f">= {floor}")
    out = failed if want else warned
    return out(
        f"nofile soft limit {soft}: DataLoader workers sharing tensors run out of descriptors"
        + (f" (gpunode_tuning set {want})" if want else ""),
        value=soft,
        expected=f">= {floor}",
        hint=fixes.RUNTIME_NOFILE if _runtime_owns(s, "limits_nofile", "limits") else fixes.NOFILE,
    )


@check("tuning.E011", "Training environment file", weight=2, needs=("tuning", "facts"))
def env_file(s: Any) -> Outcome:
    env = s.tuning.env
    path = s.tuning.env_file
    if isinstance(env, Unavailable):
        if s.facts.has(TF, "env_file"):
            return failed(
                f"{path} recorded by gpunode_tuning is gone: {env.reason}", value=None, hint=fixes.ENV_FILE
            )
        return warned(
            f"{path}: {env.reason}; the node does not look tuned by gpunode_tuning",
            value=None,
            hint=fixes.ENV_FILE,
        )
    keys = ", ".join(sorted(env)) or "no keys"
    if s.tuning.env_problems:
        return failed(
            f"{path}: {'; '.join(s.tuning.env_problems)} (left out of every check and child)",
            value=keys,
            hint=fixes.ENV_FILE,
        )
    return passed(f"{path}: {keys}", value=keys)
