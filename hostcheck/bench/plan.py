"""Which A/B comparisons to run on this node, as data. Pure: :func:`build_plan` gets what discovery found
(:class:`BenchEnv`) and returns groups to run and skips with a reason and a hint; nothing here touches the host.

A :class:`Group` is one workload with a baseline variant (index 0) and one or more tunings; every tuning is
compared with the baseline of its own round (docs/bench.md, "How").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

TUNINGS = ("pillow", "allocator", "threads", "workers", "pin_memory", "persistent_workers", "shm")

#: PyTorch's CPU performance tuning guide (and Intel's) MALLOC_CONF for jemalloc.
JEMALLOC_GUIDE_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
    "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)
#: gpunode_tuning_jemalloc_conf's default: never give memory back, so no page-fault storm each step.
JEMALLOC_DECAY_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
#: What the role sets beside a tcmalloc preload (no "large alloc" reports below 64 GiB).
TCMALLOC_ENV = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "68719476736"}
SONAMES = {
    "jemalloc": "libjemalloc.so.2",
    "tcmalloc": "libtcmalloc.so.4",
    "tcmalloc_minimal": "libtcmalloc_minimal.so.4",
}
PACKAGES = {
    "debian": {
        "jemalloc": "libjemalloc2",
        "tcmalloc": "libgoogle-perftools4 (libgoogle-perftools4t64 on Debian 13 / Ubuntu 24.04)",
        "tcmalloc_minimal": "libtcmalloc-minimal4 (libtcmalloc-minimal4t64 on Debian 13 / Ubuntu 24.04)",
    },
    "redhat": {
        "jemalloc": "jemalloc (EPEL)",
        "tcmalloc": "gperftools-libs (EPEL)",
        "tcmalloc_minimal": "gperftools-libs (EPEL)",
    },
}
DEFAULT_WHEEL_DIRS = ("/var/cache/gpunode/wheels",)
#: The role's accepted /dev/shm sizes (roles/gpunode_tuning/tasks/assert.yml).
SHM_SIZE_RE = re.compile(r"^([0-9]+[kKmMgGtT]?|[0-9]+%)$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

#: Workload sizes. CPU: a training step of about 0.1-0.3 s on 2 cores; GPU: big enough to mean something.
TRAIN_CPU = {"batch": 32, "size": 96, "channels": [16, 32, 64], "measure_s": 0.6, "min_steps": 3}
TRAIN_GPU = {"batch": 64, "size": 224, "channels": [32, 64, 128, 256], "measure_s": 0.6, "min_steps": 5}


def shm_size_bytes(size: str, mem_total: int = 0) -> int | None:
    """Bytes of a tmpfs size= value (512M, 64G, 50%); None when a percentage is given without RAM."""
    m = SHM_SIZE_RE.match(size or "")
    if not m:
        raise ValueError(f"not a tmpfs size: {size!r}")
    if size.endswith("%"):
        return mem_total * int(size[:-1]) // 100 if mem_total else None
    unit = size[-1].lower() if size[-1].isalpha() else ""
    return int(size.rstrip("kKmMgGtT")) * _UNITS[unit]


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    #: Environment variables set in the child (on top of the cleaned base environment).
    env: dict[str, str] = field(default_factory=dict)
    #: Worker config overrides (workers, pin_memory, ...).
    config: dict[str, Any] = field(default_factory=dict)
    #: What the child must prove (proof.check_record).
    expect: dict[str, Any] = field(default_factory=dict)
    #: A wheel unpacked into a folder put first on PYTHONPATH (done by the runner).
    overlay_wheel: str | None = None
    #: Run inside a private mount namespace with a tmpfs of this size on /dev/shm.
    shm_size: str | None = None
    #: When set, a crash of this side during the workload is this finding, not a bench error.
    crash_finding: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "env": dict(self.env),
            "config": dict(self.config),
            "expect": dict(self.expect),
            "overlay_wheel": self.overlay_wheel,
            "shm_size": self.shm_size,
        }


@dataclass(frozen=True)
class Group:
    key: str
    tuning: str
    workload: str
    title: str
    #: Worker config shared by the variants (workload sizes).
    config: dict[str, Any]
    #: variants[0] is the baseline.
    variants: tuple[Variant, ...]


@dataclass(frozen=True)
class Skip:
    tuning: str
    what: str
    reason: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"tuning": self.tuning, "what": self.what, "reason": self.reason, "hint": self.hint}


@dataclass(frozen=True)
class Plan:
    groups: tuple[Group, ...]
    skips: tuple[Skip, ...]

    def runs(self, pairs: int, warmup: int) -> int:
        return sum(len(g.variants) * (pairs + warmup) for g in self.groups)

    def processes(self) -> int:
        """Worker processes: one per variant of every group (each serves all of that variant's runs)."""
        return sum(len(g.variants) for g in self.groups)


@dataclass(frozen=True)
class BenchEnv:
    """What discovery found; everything the plan depends on."""

    cpus: int = 1
    physical_cores: int = 1
    gpus: int = 0
    python_tag: str = ""
    machine: str = ""
    #: "debian", "redhat" or "" (package hints).
    os_family: str = ""
    mem_total: int = 0
    #: The PIL the training Python imports (worker.pil_info), None without PIL.
    pil: dict[str, Any] | None = None
    #: allocator kind -> library path, or None when not installed.
    allocators: dict[str, str | None] = field(default_factory=dict)
    #: Wheel files found (explicit options first, then the default folders).
    wheels: tuple[str, ...] = ()
    wheel_dirs: tuple[str, ...] = DEFAULT_WHEEL_DIRS
    #: Whether a private mount namespace with its own /dev/shm can be made, and why not.
    shm_ok: bool = False
    shm_reason: str = ""

    @property
    def has_pil(self) -> bool:
        return bool(self.pil and self.pil.get("version"))

    @property
    def pil_simd(self) -> bool:
        return bool(self.pil and self.pil.get("simd"))


@dataclass(frozen=True)
class PlanOptions:
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    images: int = 192
    batch: int = 32
    crop: int = 224
    seed: int = 0
    quick: bool = False
    shm_small: str = "64M"
    shm_large: str = "50%"
    #: Explicit wheel files (a folder was expanded by discovery); None: look in BenchEnv.wheels.
    pillow_wheel: str | None = None
    pillow_simd_wheel: str | None = None
    #: Give a group with N workers at least 4 batches per worker (--images not given explicitly).
    scale_images: bool = True


def images_for(opts: PlanOptions, workers: int, batch: int | None = None) -> int:
    """Images per epoch for a group with ``workers``: with few batches per worker an epoch measures the
    workers' start-up, not their throughput."""
    if not opts.scale_images:
        return opts.images
    return max(opts.images, (batch or opts.batch) * 4 * workers)


# ------------------------------------------------------------------------------------------------ wheels

_WHEEL_RE = re.compile(
    r"^(?P<dist>[^-]+)-(?P<ver>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


def parse_wheel_name(path: str) -> dict[str, str] | None:
    m = _WHEEL_RE.match(os.path.basename(path))
    if not m:
        return None
    d = m.groupdict()
    d["dist"] = d["dist"].lower().replace("-", "_").replace(".", "_")
    return d


def wheel_fits(path: str, dist: str, tag: str, machine: str) -> bool:
    w = parse_wheel_name(path)
    if not w or w["dist"] != dist.replace("-", "_"):
        return False
    pys = w["py"].split(".")
    py_ok = not tag or tag in pys or "py3" in pys or (w["abi"] == "abi3" and _abi3_fits(pys, tag))
    plat_ok = not machine or w["plat"] == "any" or machine in w["plat"]
    return py_ok and plat_ok


def _abi3_fits(pys: list[str], tag: str) -> bool:
    """cp38-abi3 runs on any CPython >= 3.8."""
    try:
        ours = int(tag[3:])
        return any(p.startswith("cp3") and int(p[3:]) <= ours for p in pys)
    except ValueError:
        return False


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v))


def pick_wheel(paths: tuple[str, ...], dist: str, tag: str, machine: str) -> str | None:
    """The best wheel of ``dist`` for this Python: an AVX2 build first (the role names its folders
    ``...-avx2``), then the newest version."""
    fits = [p for p in paths if wheel_fits(p, dist, tag, machine)]
    if not fits:
        return None

    def key(p: str) -> tuple:
        w = parse_wheel_name(p) or {"ver": "0"}
        try:
            ver = _version_key(w["ver"])
        except TypeError:
            ver = ()
        return ("avx2" in p.lower(), ver, p)

    try:
        return max(fits, key=key)
    except TypeError:  # versions that do not compare: the last one found
        return fits[-1]


# --------------------------------------------------------------------------------------------- building


def _n_workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


def selected(tuning: str, opts: PlanOptions) -> bool:
    return (not opts.only or tuning in opts.only) and tuning not in opts.skip


def _pkg_hint(kind: str, family: str) -> str:
    if family in PACKAGES:
        tool = "apt-get install" if family == "debian" else "dnf install"
        return f"{tool} {PACKAGES[family][kind]}"
    return f"install {PACKAGES['debian'][kind]} (Debian/Ubuntu) or {PACKAGES['redhat'][kind]} (RHEL family)"


def pipeline_config(opts: PlanOptions, gpus: int) -> dict[str, Any]:
    return {
        "workload": "pipeline",
        "images": opts.images,
        "batch": opts.batch,
        "crop": opts.crop,
        "workers": 0,
        "epochs": 1,
        "seed": opts.seed,
        "device": "cuda" if gpus else "cpu",
    }


def train_config(opts: PlanOptions, gpus: int) -> dict[str, Any]:
    cfg = dict(TRAIN_GPU if gpus else TRAIN_CPU)
    if opts.quick:
        cfg["measure_s"] = 0.4
    cfg.update(workload="train", seed=opts.seed, device="cuda" if gpus else "cpu", warmup_steps=2)
    return cfg


def build_plan(env: BenchEnv, opts: PlanOptions) -> Plan:
    groups: list[Group] = []
    skips: list[Skip] = []
    rec = recommended_workers(env.cpus, env.gpus)
    pipe = pipeline_config(opts, env.gpus)
    train = train_config(opts, env.gpus)
    no_pil = (
        "the training Python cannot import PIL",
        "install Pillow (or let gpunode_tuning build pillow-simd) into the training venv",
    )

    def need_pil(tuning: str, what: str) -> bool:
        if env.has_pil:
            return True
        skips.append(Skip(tuning, what, *no_pil))
        return False

    if selected("pillow", opts) and need_pil("pillow", "Pillow vs pillow-simd"):
        groups += _pillow_groups(env, opts, pipe, rec, skips)
    if selected("allocator", opts):
        groups += _allocator_groups(env, pipe, train, skips, need_pil)
    if selected("threads", opts):
        groups.append(_threads_group(env, train))
    if selected("workers", opts) and need_pil("workers", "DataLoader num_workers"):
        groups += _workers_groups(env, opts, pipe, train, rec)
    if selected("pin_memory", opts):
        if not env.gpus:
            skips.append(
                Skip(
                    "pin_memory",
                    "pin_memory on vs off",
                    "no CUDA device: pinned memory only speeds up copies to an accelerator",
                    "run the bench on a GPU node",
                )
            )
        elif need_pil("pin_memory", "pin_memory on vs off"):
            cfg = dict(pipe, workers=rec, images=images_for(opts, rec))
            groups.append(
                Group(
                    "pin_memory/pipeline",
                    "pin_memory",
                    "pipeline",
                    f"pipeline to the GPU, {_n_workers(rec)}",
                    cfg,
                    (
                        Variant("unpinned", "pin_memory=False", config={"pin_memory": False}),
                        Variant("pinned", "pin_memory=True", config={"pin_memory": True}),
                    ),
                )
            )
    if selected("persistent_workers", opts) and need_pil("persistent_workers", "persistent_workers"):
        # Several short epochs: what persistence saves is the workers' start-up at every epoch.
        cfg = dict(pipe, workers=rec, epochs=4, images=max(opts.batch * 2, images_for(opts, rec) // 4))
        groups.append(
            Group(
                "persistent_workers/pipeline",
                "persistent_workers",
                "pipeline",
                f"pipeline, {_n_workers(rec)}, 4 short epochs",
                cfg,
                (
                    Variant(
                        "not-persistent", "persistent_workers=False", config={"persistent_workers": False}
                    ),
                    Variant("persistent", "persistent_workers=True", config={"persistent_workers": True}),
                ),
            )
        )
    if selected("shm", opts):
        if not env.shm_ok:
            skips.append(
                Skip(
                    "shm",
                    f"/dev/shm {opts.shm_small} vs {opts.shm_large}",
                    env.shm_reason or "cannot mount a private /dev/shm",
                    "run as root with CAP_SYS_ADMIN (in a container: --cap-add SYS_ADMIN) and util-linux's unshare",
                )
            )
        elif need_pil("shm", f"/dev/shm {opts.shm_small} vs {opts.shm_large}"):
            groups.append(_shm_group(env, opts, pipe, rec))
    return Plan(tuple(groups), tuple(skips))


def _pillow_groups(env: BenchEnv, opts: PlanOptions, pipe: dict, rec: int, skips: list[Skip]) -> list[Group]:
    pil = env.pil or {}
    installed = f"{'pillow-simd' if env.pil_simd else 'Pillow'} {pil.get('version')} (installed)"
    what = "Pillow vs pillow-simd"
    if env.pil_simd:
        wheel = opts.pillow_wheel or pick_wheel(env.wheels, "pillow", env.python_tag, env.machine)
        if not wheel:
            skips.append(
                Skip(
                    "pillow",
                    what,
                    f"pillow-simd is installed and no stock Pillow wheel for {env.python_tag or 'this Python'} "
                    f"({env.machine}) was given or found in {', '.join(env.wheel_dirs)}",
                    "pip download --no-deps pillow -d DIR, then --pillow-wheel DIR",
                )
            )
            return []
        other = parse_wheel_name(wheel) or {"ver": "?"}
        a = Variant(
            "pillow",
            f"Pillow {other['ver']} (wheel overlay)",
            expect={"pil": "pillow"},
            overlay_wheel=wheel,
        )
        b = Variant("pillow-simd", installed, expect={"pil": "pillow-simd"})
    else:
        wheel = opts.pillow_simd_wheel or pick_wheel(env.wheels, "pillow_simd", env.python_tag, env.machine)
        if not wheel:
            skips.append(
                Skip(
                    "pillow",
                    what,
                    f"Pillow is installed and no pillow-simd wheel for {env.python_tag or 'this Python'} "
                    f"({env.machine}) was given or found in {', '.join(env.wheel_dirs)}",
                    "run gpunode_tuning (it keeps its wheels in /var/cache/gpunode/wheels), or build one: "
                    'CC="cc -mavx2" pip wheel --no-deps --no-binary :all: pillow-simd -w DIR, then '
                    "--pillow-simd-wheel DIR",
                )
            )
            return []
        other = parse_wheel_name(wheel) or {"ver": "?"}
        a = Variant("pillow", installed, expect={"pil": "pillow"})
        b = Variant(
            "pillow-simd",
            f"pillow-simd {other['ver']} (wheel overlay)",
            expect={"pil": "pillow-simd"},
            overlay_wheel=wheel,
        )
    out = []
    for w in sorted({0, rec}):
        out.append(
            Group(
                f"pillow/pipeline-{w}w",
                "pillow",
                "pipeline",
                f"pipeline, {_n_workers(w)}",
                dict(pipe, workers=w, images=images_for(opts, w)),
                (a, b),
            )
        )
    return out


def allocator_variants(env: BenchEnv, skips: list[Skip]) -> list[Variant]:
    out = [Variant("glibc", "glibc malloc", expect={"allocator": "glibc"})]
    je = env.allocators.get("jemalloc")
    if je:
        for key, label, conf in (
            ("jemalloc", "jemalloc, default settings", ""),
            ("jemalloc-guide", "jemalloc, PyTorch guide MALLOC_CONF", JEMALLOC_GUIDE_CONF),
            ("jemalloc-decay", "jemalloc, decay -1 (role default conf)", JEMALLOC_DECAY_CONF),
        ):
            env_vars = {"LD_PRELOAD": je}
            if conf:
                env_vars["MALLOC_CONF"] = conf
            out.append(
                Variant(
                    key,
                    label,
                    env=env_vars,
                    expect={"allocator": "jemalloc", "allocator_path": je, "malloc_conf": conf},
                )
            )
    else:
        skips.append(
            Skip(
                "allocator",
                "jemalloc",
                f"{SONAMES['jemalloc']} not found (ldconfig -p)",
                _pkg_hint("jemalloc", env.os_family),
            )
        )
    for kind, label in (
        ("tcmalloc", "tcmalloc (gperftools, full)"),
        ("tcmalloc_minimal", "tcmalloc_minimal (the role's tcmalloc)"),
    ):
        path = env.allocators.get(kind)
        if not path:
            skips.append(
                Skip(
                    "allocator",
                    kind,
                    f"{SONAMES[kind]} not found (ldconfig -p)",
                    _pkg_hint(kind, env.os_family),
                )
            )
            continue
        out.append(
            Variant(
                kind,
                label,
                env={"LD_PRELOAD": path, **TCMALLOC_ENV},
                expect={"allocator": kind, "allocator_path": path},
            )
        )
    return out


def _allocator_groups(env: BenchEnv, pipe: dict, train: dict, skips: list[Skip], need_pil) -> list[Group]:
    variants = tuple(allocator_variants(env, skips))
    if len(variants) < 2:
        return []
    out = []
    if need_pil("allocator", "allocators on the pipeline"):
        out.append(
            Group("allocator/pipeline", "allocator", "pipeline", "pipeline, 0 workers", pipe, variants)
        )
    out.append(Group("allocator/train", "allocator", "train", _train_title(train), train, variants))
    return out


def _train_title(train: dict) -> str:
    return f"train, batch {train['batch']} at {train['size']} px, {train['device']}"


def thread_counts(env: BenchEnv) -> list[int]:
    """1 (the usual "avoid oversubscription" advice), physical cores per GPU (the role's automatic value)
    and logical CPUs per GPU when hyper-threads exist."""
    gpus = max(1, env.gpus)
    phys = max(1, min(env.cpus, env.physical_cores) // gpus)
    logical = max(1, env.cpus // gpus)
    return sorted({1, phys, logical})


def _threads_group(env: BenchEnv, train: dict) -> Group:
    variants = [Variant("unset", "OMP_NUM_THREADS unset", expect={})]
    for n in thread_counts(env):
        variants.append(
            Variant(
                f"omp-{n}",
                f"OMP_NUM_THREADS={n}",
                env={"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n)},
                expect={"threads": n},
            )
        )
    return Group("threads/train", "threads", "train", _train_title(train), train, tuple(variants))


# Also hostcheck/inside/fixtures.py's (the workload probe runs in the training Python and imports nothing of this
# side, and this side imports nothing of hostcheck.inside): test_bench_plan pins the two to one rule.
def recommended_workers(cpus: int, gpus: int) -> int:
    """The usual rule: the CPUs per GPU, less one for the training process, at most 8, at least 1."""
    per_gpu = max(1, cpus // max(1, gpus))
    return max(1, min(8, per_gpu - 1))


def worker_counts(env: BenchEnv) -> list[int]:
    cap = max(1, min(env.cpus, 8))
    rec = recommended_workers(env.cpus, env.gpus)
    return sorted({n for n in (1, 2, 4, 8) if n <= cap} | {min(rec, cap)})


def _workers_groups(env: BenchEnv, opts: PlanOptions, pipe: dict, train: dict, rec: int) -> list[Group]:
    variants = [Variant("w0", "num_workers=0", config={"workers": 0})]
    for n in worker_counts(env):
        variants.append(Variant(f"w{n}", f"num_workers={n}", config={"workers": n}))
    most = max(v.config["workers"] for v in variants)
    cfg = dict(pipe, images=images_for(opts, most))
    out = [Group("workers/pipeline", "workers", "pipeline", "pipeline alone", cfg, tuple(variants))]
    if not opts.quick:
        # With a model training in the same process the workers compete with its threads for the cores.
        tb = int(train["batch"])
        e2e = dict(train, epochs=1, images=max(tb * 4, images_for(opts, rec, tb) // 2), workload="e2e")
        out.append(
            Group(
                "workers/e2e",
                "workers",
                "e2e",
                f"pipeline feeding the training step (crops at {train['size']} px)",
                e2e,
                (
                    Variant("w0", "num_workers=0", config={"workers": 0}),
                    Variant(f"w{rec}", f"num_workers={rec}", config={"workers": rec}),
                ),
            )
        )
    return out


#: The /dev/shm comparison pauses the consumer after the first batch (this times its wait, at least 0.5 s,
#: not timed) so the workers fill their queues: workers x prefetch_factor batches in shared memory at once.
SHM_FILL_PAUSE = 2.5


def _shm_group(env: BenchEnv, opts: PlanOptions, pipe: dict, rec: int) -> Group:
    workers = max(2, rec)
    small_bytes = shm_size_bytes(opts.shm_small, env.mem_total)
    expect_small = {"shm_max_bytes": small_bytes + (1 << 20)} if small_bytes else {}
    small = Variant(
        "shm-small",
        f"/dev/shm {opts.shm_small}",
        expect=expect_small,
        shm_size=opts.shm_small,
        crash_finding=f"a {opts.shm_small} /dev/shm breaks DataLoader workers "
        f"({workers} workers, batch {opts.batch} at {opts.crop} px)",
    )
    large = Variant("shm-large", f"/dev/shm {opts.shm_large}", shm_size=opts.shm_large)
    images = opts.batch * (2 * workers + 2)  # enough to fill every prefetch queue once
    return Group(
        "shm/pipeline",
        "shm",
        "pipeline",
        f"pipeline, {workers} workers, queues filled",
        dict(pipe, workers=workers, fill_pause=SHM_FILL_PAUSE, images=images),
        (small, large),
    )
