"""``hostcheck bench``: what each CPU-side tuning buys on this node. The command line around it (exit 2 on usage
errors, signals, --debug) is hostcheck.command.

Exit codes: 0 it ran (also when a tuning hurts), 1 it ran but no comparison could be measured,
2 usage or environment error (training Python missing, no torch in it). Docs: docs/bench.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from argparse import ArgumentError
from dataclasses import dataclass, replace
from typing import Any, Callable

from hostcheck.argtypes import seconds
from hostcheck.bench import discover
from hostcheck.bench.advice import advise, render_advice
from hostcheck.bench.chart import chart_spec, render_png
from hostcheck.bench.eta import Eta
from hostcheck.bench.plan import (
    SHM_SIZE_RE,
    TUNINGS,
    BenchEnv,
    PlanOptions,
    build_plan,
    pick_wheel,
    recommended_workers,
    shm_size_bytes,
)
from hostcheck.bench.render import document, render_json, render_text
from hostcheck.bench.run import Context, base_environment, probe_python, run_plan
from hostcheck.child.launch import python_arg, pythonpath_root
from hostcheck.exitcodes import EXIT_NOTHING_MEASURED, EXIT_OK, EXIT_USAGE
from hostcheck.gather.base import read_text
from hostcheck.gather.facts import gather_facts
from hostcheck.gather.system import gather_system
from hostcheck.gather.torchinfo import choose_python
from hostcheck.inside.proof import describe_pil
from hostcheck.outfile import paths_error, write_report
from hostcheck.progress import duration, progress
from hostcheck.report import now_iso

# One warm-up round by default: each variant's worker process makes its first, cold measurement (first
# DataLoader, first training step, allocator arenas still empty) in it, and it is discarded. It costs one run
# per variant, no process start. 192 images: the default plan in under 5 minutes on 2 cores (docs/bench.md,
# "Time"); groups with many workers get more.
DEFAULTS = {"pairs": 5, "warmup_pairs": 1, "images": 192}
QUICK = {"pairs": 3, "warmup_pairs": 1, "images": 128}

SUMMARY = "measure what each CPU-side tuning buys on this node (docs/bench.md)"
DESCRIPTION = (
    "Measure what each CPU-side tuning buys on this node: pillow-simd, malloc allocators, "
    "OMP_NUM_THREADS, DataLoader workers / pin_memory / persistent_workers, /dev/shm size. Every "
    "comparison is A/B in interleaved rounds (one worker process of the training Python per variant) and "
    "reported as the median of the paired ratios with their spread and a verdict."
)
EPILOG = (
    f"Comparisons: {', '.join(TUNINGS)}. Exit codes: 0 ran (also when a tuning hurts), "
    "1 nothing could be measured, 2 usage or environment error, 129/130/143 SIGHUP/SIGINT/SIGTERM (after "
    "printing what was measured). Docs: docs/bench.md"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """bench's options."""
    sel = p.add_argument_group("selection")
    sel.add_argument(
        "--only", action="append", metavar="NAME", help="run only these (comma list, repeatable)"
    )
    sel.add_argument(
        "--skip", action="append", metavar="NAME", help="leave these out (comma list, repeatable)"
    )
    sel.add_argument("--list", action="store_true", help="print the plan (comparisons and skips) and exit")
    size = p.add_argument_group("size")
    size.add_argument("--pairs", type=int, metavar="N", help="measured rounds per comparison (default 5)")
    size.add_argument(
        "--warmup-pairs", type=int, metavar="N", help="rounds run first and discarded (default 1)"
    )
    size.add_argument("--images", type=int, metavar="N", help="JPEGs per pipeline epoch (default 192)")
    size.add_argument("--batch", type=int, default=32, metavar="N", help="DataLoader batch size (default 32)")
    size.add_argument(
        "--quick", action="store_true", help="3 pairs, 128 images, shorter training runs, no e2e workload"
    )
    size.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of images, crops, shuffling, model"
    )
    env = p.add_argument_group("environment")
    env.add_argument(
        "--python",
        metavar="PATH",
        type=python_arg,
        help="the training Python (default: the venv in the local facts)",
    )
    env.add_argument("--facts-dir", default="/etc/ansible/facts.d", metavar="DIR", help="Ansible local facts")
    env.add_argument(
        "--timeout", type=seconds, default=120.0, metavar="S", help="hard limit of one run (default 120)"
    )
    env.add_argument(
        "--workdir", metavar="DIR", help="images and wheel overlays (default ~/.cache/hostcheck/bench)"
    )
    env.add_argument(
        "--shm-small", default="64M", metavar="SIZE", help="the small /dev/shm (default 64M, a container's)"
    )
    env.add_argument(
        "--shm-large",
        default="50%",
        metavar="SIZE",
        help="the large /dev/shm (default 50%%, gpunode_tuning_shm_size's default)",
    )
    env.add_argument("--pillow-wheel", metavar="PATH", help="stock Pillow wheel (or a folder of wheels)")
    env.add_argument(
        "--pillow-simd-wheel",
        metavar="PATH",
        help="pillow-simd wheel or folder (default: look in /var/cache/gpunode/wheels)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="write the JSON document (every pair's figures) to PATH")
    out.add_argument("--png", metavar="PATH", help="write a bar chart of the ratios to PATH")
    out.add_argument(
        "--apply-advice",
        action="store_true",
        help="print the gpunode_tuning variables and DataLoader settings the measurements support",
    )
    out.add_argument("--advice-file", metavar="PATH", help="also write that advice (YAML) to PATH")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def validate(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the --quick defaults and reject bad input (raises argparse.ArgumentError)."""
    base = QUICK if args.quick else DEFAULTS
    args.scale_images = args.images is None
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.pairs < 1:
        raise ArgumentError(None, "--pairs must be >= 1")
    if args.warmup_pairs < 0:
        raise ArgumentError(None, "--warmup-pairs must be >= 0")
    if args.images < 1 or args.batch < 1:
        raise ArgumentError(None, "--images and --batch must be >= 1")
    args.only, args.skip = _names(args.only), _names(args.skip)
    unknown = [n for n in args.only + args.skip if n not in TUNINGS]
    if unknown:
        raise ArgumentError(None, f"unknown comparison {', '.join(unknown)}; known: {', '.join(TUNINGS)}")
    for flag, size in (("--shm-small", args.shm_small), ("--shm-large", args.shm_large)):
        if not SHM_SIZE_RE.match(size) or (size.endswith("%") and not 1 <= int(size[:-1]) <= 100):
            raise ArgumentError(None, f"{flag} {size!r}: give a tmpfs size like 64M, 8G or 1%-100%")
    if not args.shm_small.endswith("%") and shm_size_bytes(args.shm_small) < (1 << 20):
        raise ArgumentError(None, "--shm-small must be at least 1M")
    # A percentage is of physical RAM (tmpfs(5)): compared in bytes on this node, so a huge --shm-small beside
    # --shm-large 50% is refused here, not found out by the mount.
    ram = _physical_ram()
    small, large = shm_size_bytes(args.shm_small, ram), shm_size_bytes(args.shm_large, ram)
    if small is not None and large is not None and small >= large:
        raise ArgumentError(
            None,
            f"--shm-small {args.shm_small} must be smaller than --shm-large {args.shm_large} on this node",
        )
    if not 0 <= args.seed <= MAX_SEED:
        raise ArgumentError(None, f"--seed {args.seed}: give a whole number from 0 to {MAX_SEED}")
    if args.python and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ArgumentError(None, f"--python {args.python}: not an executable file")
    for flag, path in (
        ("--pillow-wheel", args.pillow_wheel),
        ("--pillow-simd-wheel", args.pillow_simd_wheel),
    ):
        if path and not os.path.exists(path):
            raise ArgumentError(None, f"{flag} {path}: no such file or folder")
    bad_path = paths_error([("--json", args.json), ("--png", args.png), ("--advice-file", args.advice_file)])
    if bad_path:
        raise ArgumentError(None, bad_path)
    if args.advice_file:
        args.apply_advice = True
    return args


def default_workdir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "hostcheck", "bench")


#: torch.manual_seed takes at most 0xffff_ffff_ffff_ffff (and raises past it): docs.pytorch.org,
#: torch.manual_seed, "Value must be within the inclusive range [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff]".
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF


def _physical_ram() -> int:
    """Bytes of physical RAM, what a tmpfs size in % is of; 0 when unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


def _names(values: list[str] | None) -> tuple[str, ...]:
    return tuple(x.strip() for v in values or [] for x in v.split(",") if x.strip())


def _explicit_wheel(path: str | None, dist: str, flag: str, tag: str, machine: str) -> str | None:
    if not path:
        return None
    wheel = pick_wheel(discover.find_wheels([path], ()), dist, tag, machine)
    if not wheel:
        raise ArgumentError(None, f"{flag} {path}: no {dist} wheel for {tag} on {machine} there")
    return wheel


@dataclass(frozen=True)
class _Setup:
    """What was gathered before planning: the training Python's probe, the host, discovery."""

    python: str
    source: str
    workdir: str
    ctx: Any
    probe: dict[str, Any]
    system: dict[str, Any]
    env: Any
    facts: Any
    stripped: dict[str, str]


class _EnvError(Exception):
    pass


def _setup(args: argparse.Namespace, say: Callable[[str], None]) -> _Setup:
    facts = gather_facts(args.facts_dir)
    python, source = choose_python(args.python, facts)
    workdir = os.path.abspath(args.workdir or default_workdir())
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as exc:
        if args.workdir:
            raise ArgumentError(None, f"--workdir {workdir}: {exc}") from None
        workdir = os.path.join(tempfile.gettempdir(), f"hostcheck-bench-{os.getuid()}")
        os.makedirs(workdir, exist_ok=True)
    base_env, stripped = base_environment()
    ctx = Context(python, base_env, pythonpath_root(workdir), workdir, args.timeout)
    say(f"probing the training Python {python} ({source})")
    probe, err = probe_python(ctx)
    if err or probe is None:
        raise _EnvError(f"the training Python {python} ({source}) cannot run the bench: {err}")
    if not probe.get("torch"):
        raise _EnvError(
            f"the training Python {python} ({source}) has no torch ({probe.get('torch_error')}); "
            "pass --python with the venv that trains"
        )
    system = _system()
    torch_info = probe["torch"]
    cpus = int(probe.get("cpus") or system.get("logical_cpus") or 1)
    osr = read_text("/etc/os-release")
    shm_ok, shm_reason = discover.shm_capability()
    env = BenchEnv(
        cpus=cpus,
        physical_cores=int(system.get("physical_cores") or cpus),
        gpus=len(torch_info.get("gpus") or []) if torch_info.get("cuda_available") else 0,
        python_tag=probe.get("tag", ""),
        machine=probe.get("machine", ""),
        os_family=discover.os_family(osr if isinstance(osr, str) else ""),
        mem_total=int(system.get("mem_total_bytes") or 0),
        pil=probe.get("pil"),
        allocators=discover.find_allocators(probe.get("machine", "")),
        wheels=discover.find_wheels([args.pillow_wheel, args.pillow_simd_wheel]),
        shm_ok=shm_ok,
        shm_reason=shm_reason,
    )
    return _Setup(python, source, workdir, ctx, probe, system, env, facts, stripped)


def _plan_options(args: argparse.Namespace, env: Any) -> PlanOptions:
    tag, machine = env.python_tag, env.machine
    return PlanOptions(
        only=args.only,
        skip=args.skip,
        images=args.images,
        batch=args.batch,
        seed=args.seed,
        quick=args.quick,
        scale_images=args.scale_images,
        shm_small=args.shm_small,
        shm_large=args.shm_large,
        pillow_wheel=_explicit_wheel(args.pillow_wheel, "pillow", "--pillow-wheel", tag, machine),
        pillow_simd_wheel=_explicit_wheel(
            args.pillow_simd_wheel, "pillow_simd", "--pillow-simd-wheel", tag, machine
        ),
    )


def run(args: argparse.Namespace) -> int:
    """``hostcheck bench``: probe the training Python, plan, run, report."""
    started = time.monotonic()
    when = now_iso()
    args = validate(args)

    def say(s: str) -> None:
        if not args.quiet:
            print(f"hostcheck bench: {s}", file=sys.stderr, flush=True)

    try:
        setup = _setup(args, say)
    except _EnvError as exc:
        print(f"hostcheck bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    plan = build_plan(setup.env, _plan_options(args, setup.env))
    if args.list:
        sys.stdout.write(_render_plan(plan, args))
        return EXIT_OK

    total = plan.runs(args.pairs, args.warmup_pairs)
    eta = Eta.of(plan, args.pairs, args.warmup_pairs)
    line = progress("hostcheck bench", None if args.quiet else sys.stderr)
    with line:  # erased before the tables are printed

        def tell(s: str) -> None:
            line.print(f"hostcheck bench: {s}")

        tell(
            f"{len(plan.groups)} groups, {total} runs in {plan.processes()} worker processes; workdir "
            f"{setup.workdir}; how long it takes follows from the first runs' measured cost"
        )
        first = len(plan.groups[0].variants) if plan.groups else 0
        done = [0]

        def ran(s: str) -> None:
            done[0] += 1
            tell(f"[{done[0]}/{total}] {s}")
            left = eta.left_s()
            if left is None:
                return
            so_far = time.monotonic() - started
            line.note(done[0], total)
            line.estimate(so_far + left)
            if done[0] == first:  # each of the first group's workers has answered once: the costs are known
                tell(_measured(eta, plan.groups[0].workload, so_far, left))

        ctx = replace(setup.ctx, progress=ran, log=tell, eta=eta)
        bench = run_plan(ctx, plan, args.pairs, args.warmup_pairs, args.images, args.seed)
    env = setup.env
    auto = max(1, min(env.cpus, env.physical_cores) // max(1, env.gpus))
    adv = advise(bench.comparisons, shm_large=args.shm_large, auto_threads=auto)
    doc = _document(args, setup, plan, bench, adv, when, time.monotonic() - started)
    return _emit(args, setup, plan, bench, adv, doc, when)


def _measured(eta: Eta, workload: str, so_far: float, left: float) -> str:
    """The estimate once the first runs are measured, with the costs it comes from."""
    run = eta.run_cost(workload) or 0.0
    start = f", its worker processes' start-up {eta.startup_s[0]:.1f} s" if eta.startup_s else ""
    return (
        f"measured here: a {workload} run {run:.1f} s{start}: about {duration(so_far + left)} in all, "
        f"{duration(left)} left (estimated again after every run)"
    )


def _document(args, setup: _Setup, plan, bench, adv, when: str, duration: float) -> dict[str, Any]:
    probe, system, env = setup.probe, setup.system, setup.env
    torch_info = probe["torch"]
    host = {
        "hostname": system.get("hostname"),
        "os": system.get("os_pretty"),
        "kernel": system.get("kernel"),
        "arch": env.machine,
        "cpus": env.cpus,
        "physical_cores": env.physical_cores,
        "mem_total_bytes": env.mem_total,
        "gpus": torch_info.get("gpus") or [],
        "container": system.get("container"),
        "recommended_workers": recommended_workers(env.cpus, env.gpus),
    }
    pyinfo = {
        "executable": setup.python,
        "source": setup.source,
        "version": probe.get("python"),
        "torch": torch_info.get("version"),
        "cuda": torch_info.get("cuda"),
        "pil": describe_pil(probe.get("pil")),
        "pil_info": probe.get("pil"),
        "threads": probe.get("threads"),
    }
    environment = {
        "stripped": setup.stripped,
        "shm_bytes": probe.get("shm_bytes"),
        "allocators": env.allocators,
        "wheels": list(env.wheels),
        "shm_namespace": {"ok": env.shm_ok, "reason": env.shm_reason},
        "tuning_fact": setup.facts.roles.get("gpunode_tuning"),
        "workdir": setup.workdir,
    }
    options = {
        "pairs": args.pairs,
        "warmup_pairs": args.warmup_pairs,
        "images": args.images,
        "batch": args.batch,
        "quick": args.quick,
        "seed": args.seed,
        "timeout_s": args.timeout,
        "only": list(args.only),
        "skip": list(args.skip),
        "shm_small": args.shm_small,
        "shm_large": args.shm_large,
    }
    return document(host, pyinfo, environment, options, bench, plan.skips, adv.to_dict(), when, duration)


def _emit(args, setup: _Setup, plan, bench, adv, doc: dict[str, Any], when: str) -> int:
    host, py = doc["host"], doc["python"]
    advice_text = render_advice(
        adv,
        f"hostcheck bench advice for {host['hostname']} ({when}): {args.pairs} pairs per comparison, "
        "verdict rule in docs/bench.md",
    )
    failures = []
    if args.png:
        spec = chart_spec(
            bench.comparisons,
            f"hostcheck bench: {host['hostname']}, {host['cpus']} CPUs, "
            f"{', '.join(host['gpus']) or 'no GPU'}, torch {py['torch']}",
            f"{when}; {args.pairs} pairs per comparison; {py['pil']}",
        )
        why = render_png(spec, args.png) if spec["rows"] else "nothing to draw"
        if why:
            failures.append(f"chart not written: {why}")
        doc["chart"] = {"path": None if why else os.path.abspath(args.png), "error": why}
    try:
        if args.json:
            write_report(args.json, render_json(doc))
        if args.advice_file:
            write_report(args.advice_file, advice_text)
    except OSError as exc:
        print(f"hostcheck bench: error: writing a report file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        sys.stdout.write(render_text(doc, bench.comparisons, plan.skips))
        if args.apply_advice:
            sys.stdout.write("\n" + advice_text)
        sys.stdout.flush()
    except BrokenPipeError:  # `hostcheck bench | head`: the reader left
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    for f in failures:
        print(f"hostcheck bench: {f}", file=sys.stderr)
    if bench.interrupted:
        print("hostcheck bench: interrupted: the results above are partial", file=sys.stderr)
        return EXIT_USAGE
    if bench.comparisons and all(c.status == "error" for c in bench.comparisons):
        return EXIT_NOTHING_MEASURED
    return EXIT_OK


def _system() -> dict[str, Any]:
    """Host facts from hostcheck's system gatherer (no kernel log); {} when it fails."""
    try:
        s = gather_system(read_kernel_log=False)
    except Exception:
        return {}
    return {
        "hostname": s.hostname,
        "os_pretty": s.os_pretty,
        "kernel": s.kernel,
        "logical_cpus": s.logical_cpus,
        "physical_cores": s.physical_cores,
        "mem_total_bytes": s.mem_total_bytes,
        "container": s.container,
    }


def _render_plan(plan: Any, args: argparse.Namespace) -> str:
    lines = [
        f"{plan.runs(args.pairs, args.warmup_pairs)} runs ({args.pairs} pairs + {args.warmup_pairs} warm-up) "
        f"in {plan.processes()} worker processes (one per variant):"
    ]
    for g in plan.groups:
        size = f", {g.config['images']} images" if "images" in g.config else ""
        lines.append(f"  {g.key}: {g.title}{size}")
        lines.append(f"    A {g.variants[0].key}: {g.variants[0].label}")
        for v in g.variants[1:]:
            lines.append(f"    B {v.key}: {v.label}")
    for s in plan.skips:
        lines.append(f"  skipped {s.tuning} ({s.what}): {s.reason}" + (f"; hint: {s.hint}" if s.hint else ""))
    return "\n".join(lines) + "\n"
