"""Run a plan: one long-lived worker process of the training Python per variant of a group, rounds
interleaved, results as data.

Each worker (``python -m hostcheck.inside.bench_worker --serve``, hostcheck.child.session) gets a clean environment
(the tuning variables hostcheck itself was started with are removed and reported, then the variant's own are
set), PYTHONPATH with any PIL overlay first and hostcheck after it, and the ``unshare`` wrapper of a /dev/shm
variant. It proves what it got in its hello line and in every answer; each measurement has a hard timeout
that kills the worker's process group. A worker that crashes, hangs or prints nonsense becomes an error for
its variant; the other variants and groups go on. Every group's workers are ended when the group ends, fails
or is interrupted. The probe and the JPEG writer are one-shot children (launch.run_child); every
process, worker or one-shot, starts through hostcheck.child.launch, so its kill_all() (SIGINT/SIGTERM) ends them all.

Why one module: the group of workers, the interleaved rounds and the per-answer proofs share one state (which
worker is usable, which variant failed and why); split, each part would need the others' private state.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable

from hostcheck import infile
from hostcheck.bench.discover import avx2_instructions
from hostcheck.bench.plan import Group, Plan, Variant
from hostcheck.bench.stats import HELPS, HURTS, Summary, schedule, summarize
from hostcheck.child.launch import ProbeRun, child_env, inside_argv, inside_env, run_child
from hostcheck.child.session import CLOSE_GRACE_S, Server, close_all
from hostcheck.inside import proof

#: Tuning variables never inherited by a child: each variant sets its own (docs/bench.md).
STRIP_KEYS = ("LD_PRELOAD", "MALLOC_CONF", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
STRIP_PREFIXES = ("TCMALLOC_", "KMP_", "GOMP_", "OMP_")
#: The small-/dev/shm side runs its child through this: a tmpfs of size $1 over /dev/shm, then exec.
SHM_SCRIPT = (
    'mount -t tmpfs -o "size=$1,nosuid,nodev,mode=1777" hostcheck-bench-shm /dev/shm '
    '|| { echo "hostcheck-bench: cannot mount a tmpfs on /dev/shm" >&2; exit 97; }; shift; exec "$@"'
)
SHM_MOUNT_FAILED = 97
MEASURED, ERROR, FINDING = "measured", "error", "finding"

#: (argv, env, timeout_s, name) -> ProbeRun; tests inject fakes.
Launcher = Callable[[list, dict, float, str], ProbeRun]


def default_launcher(argv: list, env: dict, timeout: float, name: str) -> ProbeRun:
    return run_child(argv, timeout, name=name, env=env)


#: (argv, env, name) -> a started worker with hello(timeout), request(cfg, timeout), end_input(),
#: close(grace), info() (hostcheck.child.session.Server); tests inject fakes.
ServerLauncher = Callable[[list, dict, str], Any]


def default_server_launcher(argv: list, env: dict, name: str) -> Server:
    return Server(argv, env, name)


def clean_env(environ: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the environment without tuning variables, what was removed)."""
    keep, gone = {}, {}
    for k, v in environ.items():
        if k in STRIP_KEYS or k.startswith(STRIP_PREFIXES):
            gone[k] = v
        else:
            keep[k] = v
    return keep, gone


@dataclass(frozen=True)
class Context:
    python: str
    base_env: dict[str, str]
    pyroot: str
    workdir: str
    timeout: float = 120.0
    launcher: Launcher = default_launcher
    #: One line per measurement (counted by the CLI).
    progress: Callable[[str], None] | None = None
    server_launcher: ServerLauncher = default_server_launcher
    #: Other progress lines (worker processes started).
    log: Callable[[str], None] | None = None
    #: Told each group's start and each run's wall time (hostcheck.bench.eta.Eta: the estimate of what is left).
    eta: Any = None


def worker_argv(
    python: str,
    cfg: dict[str, Any],
    shm_size: str | None = None,
    serve: bool = False,
    root: str | None = None,
) -> list[str]:
    """The bench worker's command (``root``: the PYTHONPATH folder, launch.pythonpath_root)."""
    args = [*(["--serve"] if serve else []), json.dumps(cfg, sort_keys=True)]
    argv = inside_argv(python, "bench_worker", *args, root=root)
    if shm_size:
        wrap = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", SHM_SCRIPT, "sh"]
        return [*wrap, shm_size, *argv]
    return argv


def variant_env(ctx: Context, variant: Variant | None = None, overlay: str | None = None) -> dict[str, str]:
    env = dict(ctx.base_env)
    env.update(variant.env if variant else {})
    return inside_env(env, first=(overlay,), root=ctx.pyroot)


def base_environment() -> tuple[dict[str, str], dict[str, str]]:
    return clean_env(child_env())


# ---------------------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class RunResult:
    group: str
    variant: str
    round: int
    warmup: bool
    value: float | None = None
    unit: str = ""
    error: str | None = None
    #: True when the error is the variant's expected failure mode (Variant.crash_finding).
    finding: bool = False
    record: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    stderr_tail: str = ""
    #: The worker process that ran it and which of its requests it was (1: the first, cold one; 0: none
    #: was sent, the worker failed at start-up).
    pid: int | None = None
    request: int = 0

    def to_dict(self) -> dict[str, Any]:
        rec = {k: v for k, v in self.record.items() if k not in ("traceback",)}
        return {
            "group": self.group,
            "variant": self.variant,
            "round": self.round,
            "warmup": self.warmup,
            "value": self.value,
            "unit": self.unit,
            "error": self.error,
            "finding": self.finding,
            "wall_s": round(self.wall_s, 3),
            "pid": self.pid,
            "request": self.request,
            "record": rec,
            "stderr_tail": self.stderr_tail if self.error else "",
        }


def judge_run(
    variant: Variant, run: ProbeRun, served: bool = False
) -> tuple[float | None, str | None, bool, dict]:
    """(value, error, is_finding, final record) of one child, or of one answer of a worker (``served``).
    Pure. A served measurement reached its workload when the answer says ``started``; a worker that died
    in a request (after its hello: torch imported, proofs passed, /dev/shm mounted) died in the workload."""
    final = next((r for r in reversed(run.records) if "ok" in r), {})
    started = any(r.get("event") == "start" or r.get("started") for r in run.records)
    started = started or (served and not run.records and run.rc is not None)
    if run.error is None and final.get("ok"):
        try:
            value = float(final["metric"])
        except (KeyError, TypeError, ValueError):
            return None, f"the result has no numeric metric: {json.dumps(final)[:200]}", False, final
        err = proof.check_record(variant.expect, final)
        if err:
            return None, err, False, final
        if math.isnan(value) or value <= 0:
            return None, f"metric is {value}", False, final
        return value, None, False, final
    if final and not final.get("ok") and final.get("error"):
        err = str(final["error"])
    else:
        err = run.error or "no result"
    if run.rc == SHM_MOUNT_FAILED and variant.shm_size:
        return (
            None,
            f"could not mount a {variant.shm_size} tmpfs on /dev/shm: {run.stderr_tail[-300:]}",
            False,
            final,
        )
    finding = bool(variant.crash_finding) and started and not run.timed_out
    return None, err, finding, final


def judge_hello(variant: Variant, run: ProbeRun) -> str | None:
    """Why a worker's start-up disqualifies it (a crash, a failed mount, a proof), or None. Pure."""
    rec = next((r for r in reversed(run.records) if "ok" in r), {})
    if run.error is None and rec.get("ok"):
        return proof.check_record(variant.expect, rec)
    if run.rc == SHM_MOUNT_FAILED and variant.shm_size:
        return f"could not mount a {variant.shm_size} tmpfs on /dev/shm: {run.stderr_tail[-300:]}"
    if rec.get("error"):
        return f"the worker did not start: {rec['error']}"
    return f"the worker did not start: {run.error or 'no hello line'}"


def request_config(group: Group, variant: Variant, cfg: dict) -> dict[str, Any]:
    full = dict(group.config)
    full.update(cfg)
    full.update(variant.config)
    full["task"] = "measure"
    full["expect"] = variant.expect
    return full


class Workers:
    """The worker processes of one group, one per variant: started together (their imports overlap), each
    proven by its hello line before any measurement, ended together. Use as a context manager."""

    def __init__(self, ctx: Context, group: Group, overlays: dict[str, str | None]):
        self.ctx, self.group = ctx, group
        self.servers: dict[str, Any] = {}
        #: variant key -> why its worker is unusable (start-up failed, proof), the hello's ProbeRun, its pid.
        self.failed: dict[str, tuple[str, ProbeRun, int | None]] = {}
        self.closed: list[dict[str, Any]] = []
        #: Variants whose PIL overlay could not be unpacked: no worker (the error is reported at its turn).
        self.no_overlay: set[str] = set()
        try:
            for v in group.variants:
                overlay = overlays.get(v.overlay_wheel) if v.overlay_wheel else None
                if v.overlay_wheel and not overlay:
                    self.no_overlay.add(v.key)
                    continue
                argv = worker_argv(ctx.python, {"expect": v.expect}, v.shm_size, serve=True, root=ctx.pyroot)
                name = f"{group.key}:{v.key}"
                self.servers[v.key] = ctx.server_launcher(argv, variant_env(ctx, v, overlay), name)
        except BaseException:
            self.close(0.0, "killed: the bench stopped")
            raise

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, exc_type: type | None, *_: object) -> None:
        # At the end of the group: a few seconds to exit on their own; on an error or Ctrl-C: at once.
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close(0.0, "killed: interrupted")
        else:
            self.close(0.0, "killed: the bench stopped on an error")

    def wait_ready(self) -> None:
        """Every hello (the baseline's first: without it the others are not waited for)."""
        t0 = time.monotonic()
        base = self.group.variants[0].key
        for v in self.group.variants:
            server = self.servers.get(v.key)
            if server is None:
                continue
            if base in self.failed:
                self.drop(v.key, "not used: the baseline's worker failed")
                continue
            run = server.hello(self.ctx.timeout)
            err = judge_hello(v, run)
            if err:
                self.failed[v.key] = (err, run, server.pid)
                self.drop(v.key, "failed at start-up")
        if self.ctx.log:
            n, ready = len(self.servers) + len(self.closed), len(self.servers)
            self.ctx.log(
                f"{self.group.key}: {ready} of {n} worker processes ready in {time.monotonic() - t0:.1f} s"
            )

    def measure(self, v: Variant, rnd: int, warm: bool, cfg: dict) -> RunResult:
        common = dict(group=self.group.key, variant=v.key, round=rnd, warmup=warm)
        if v.key in self.failed:
            err, hello, pid = self.failed[v.key]
            return RunResult(**common, error=err, wall_s=hello.wall_s, stderr_tail=hello.stderr_tail, pid=pid)
        server = self.servers.get(v.key)
        if server is None:
            return RunResult(**common, error="its worker process was already ended")
        t0 = time.monotonic()
        run = server.request(request_config(self.group, v, cfg), self.ctx.timeout)
        value, err, finding, rec = judge_run(v, run, served=True)
        return RunResult(
            **common,
            value=value,
            unit=str(rec.get("unit", "")),
            error=err,
            finding=finding,
            record=rec,
            wall_s=time.monotonic() - t0,
            stderr_tail=run.stderr_tail,
            pid=server.pid,
            request=server.requests,
        )

    def drop(self, key: str, why: str | None = None) -> None:
        """End one variant's worker now (it failed, or it has nothing left to compare with)."""
        server = self.servers.pop(key, None)
        if server is not None:
            server.close()
            self.closed.append(dict(server.info(), variant=key, note=why))

    def close(self, grace: float = CLOSE_GRACE_S, reason: str | None = None) -> None:
        """End every worker left (``grace`` 0: at once, as on Ctrl-C; ``reason``: for those killed)."""
        left = list(self.servers.items())
        self.servers = {}
        close_all([s for _, s in left], grace, reason)
        self.closed += [dict(s.info(), variant=k, note=None) for k, s in left]

    def info(self) -> list[dict[str, Any]]:
        return [dict(x, group=self.group.key) for x in self.closed]


# -------------------------------------------------------------------------------------------- a group


@dataclass(frozen=True)
class Side:
    key: str
    label: str
    env: dict[str, str]
    config: dict[str, Any]
    #: One value per measured round (None where the run failed or was not made).
    values: tuple[float | None, ...]
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "env": dict(self.env),
            "config": dict(self.config),
            "values": list(self.values),
            "error": self.error,
        }


@dataclass(frozen=True)
class Comparison:
    group: str
    tuning: str
    workload: str
    title: str
    a: Side
    b: Side
    unit: str
    status: str
    summary: Summary | None = None
    #: The error, or the finding, in one sentence.
    message: str = ""
    notes: tuple[str, ...] = ()
    #: Run order of each measured round: "AB" or "BA".
    orders: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.group}:{self.b.key}"

    @property
    def verdict(self) -> str:
        if self.status == MEASURED and self.summary is not None:
            return self.summary.verdict
        if self.status == FINDING:
            return HELPS if self.a.error else HURTS
        return "error"

    def to_dict(self) -> dict[str, Any]:
        pairs = []
        for i, (x, y) in enumerate(zip(self.a.values, self.b.values)):
            ratio = y / x if x and y else None
            pairs.append({"round": i, "a": x, "b": y, "ratio": ratio, "order": self.orders[i]})
        return {
            "key": self.key,
            "group": self.group,
            "tuning": self.tuning,
            "workload": self.workload,
            "title": self.title,
            "unit": self.unit,
            "status": self.status,
            "verdict": self.verdict,
            "message": self.message,
            "notes": list(self.notes),
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "pairs": pairs,
            "summary": self.summary.to_dict() if self.summary else None,
        }


def group_comparisons(
    group: Group,
    pairs: int,
    warmup: int,
    values: dict[str, list[float | None]],
    errors: dict[str, str],
    findings: dict[str, str],
    unit: str,
    notes: dict[str, list[str]] | None = None,
) -> list[Comparison]:
    """One comparison per tuning of the group, baseline first. Pure."""
    notes = notes or {}
    base = group.variants[0]
    orders = tuple("AB" if (warmup + i) % 2 == 0 else "BA" for i in range(pairs))

    def side(v: Variant) -> Side:
        return Side(v.key, v.label, dict(v.env), dict(v.config), tuple(values[v.key]), errors.get(v.key))

    out = []
    for v in group.variants[1:]:
        a, b = side(base), side(v)
        common = dict(group=group.key, tuning=group.tuning, workload=group.workload, title=group.title)
        common.update(a=a, b=b, unit=unit, orders=orders, notes=tuple(notes.get(v.key, [])))
        summary = summarize(values[base.key], values[v.key])
        if base.key in findings and v.key not in errors:
            out.append(Comparison(**common, status=FINDING, summary=summary, message=findings[base.key]))
        elif v.key in findings and base.key not in errors:
            out.append(Comparison(**common, status=FINDING, summary=summary, message=findings[v.key]))
        elif summary.pairs == 0:
            why = errors.get(base.key) and f"baseline ({base.label}) failed: {errors[base.key]}"
            why = why or (errors.get(v.key) and f"{v.label} failed: {errors[v.key]}") or "no pair measured"
            out.append(Comparison(**common, status=ERROR, summary=None, message=why))
        else:
            msg = ""
            if errors.get(v.key) or errors.get(base.key):
                msg = f"{summary.pairs} of {pairs} pairs measured; " + "; ".join(
                    f"{k} failed: {e}" for k, e in errors.items() if k in (base.key, v.key)
                )
            out.append(Comparison(**common, status=MEASURED, summary=summary, message=msg))
    return out


def one_line(err: str, limit: int = 400) -> str:
    """A multi-line error (a traceback from a DataLoader worker) as its first and last lines."""
    lines = [x.strip() for x in err.splitlines() if x.strip()]
    text = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _GroupState:
    """What a group has gathered so far (mutable while it runs; the results built from it are frozen)."""

    values: dict[str, list[float | None]]
    errors: dict[str, str] = field(default_factory=dict)
    findings: dict[str, str] = field(default_factory=dict)
    first: dict[str, dict] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    runs: list[RunResult] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)

    def comparisons(self, group: Group, pairs: int, warmup: int) -> list[Comparison]:
        unit = next((r.unit for r in self.runs if r.unit), "")
        return group_comparisons(
            group, pairs, warmup, self.values, self.errors, self.findings, unit, self.notes
        )


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a group, carrying what the group measured until then."""

    def __init__(
        self,
        comparisons: list[Comparison],
        runs: list[RunResult],
        processes: list[dict[str, Any]] | None = None,
    ):
        super().__init__("interrupted")
        self.comparisons = comparisons
        self.runs = runs
        self.processes = processes or []


def run_group(
    ctx: Context, group: Group, pairs: int, warmup: int, cfg: dict, overlays: dict[str, str | None]
) -> tuple[list[Comparison], list[RunResult], list[dict[str, Any]]]:
    """Rounds of every variant, mirrored order on alternate rounds, each variant's measurements made by its
    own worker process; a variant that fails once is dropped (the same setting fails the same way: a timeout
    or crash would only cost more time). Returns the comparisons, the runs and the worker processes."""
    st = _GroupState(values={v.key: [None] * pairs for v in group.variants})
    workers = None
    if ctx.eta is not None:
        ctx.eta.group_started(group.key)
    try:
        workers = Workers(ctx, group, overlays)
        with workers:
            workers.wait_ready()
            for rnd, vi, is_warm in schedule(len(group.variants), pairs, warmup):
                if not _run_one(ctx, group, pairs, warmup, cfg, workers, st, rnd, vi, is_warm):
                    break
    except KeyboardInterrupt:  # keep what was measured (the workers are ended): reported as partial
        info = workers.info() if workers else []
        raise Interrupted(st.comparisons(group, pairs, warmup), st.runs, info) from None
    return st.comparisons(group, pairs, warmup), st.runs, workers.info()


def _run_one(ctx, group, pairs, warmup, cfg, workers: Workers, st: _GroupState, rnd, vi, is_warm) -> bool:
    """One scheduled run; False when the group has nothing left to compare."""
    v, base = group.variants[vi], group.variants[0]
    if all(x.key in st.errors for x in group.variants[1:]):
        return False  # nothing left to compare the baseline with
    # A failed baseline ends the group, unless its failure is the finding (then B still runs).
    if v.key in st.errors or (base.key in st.errors and base.key not in st.findings):
        return True
    if v.key in workers.no_overlay:
        st.errors[v.key] = f"could not unpack {v.overlay_wheel}"
        return True
    res = workers.measure(v, rnd, is_warm, cfg)
    st.runs.append(res)
    if ctx.eta is not None:
        ctx.eta.run_done(group.key, group.workload, res.wall_s)
    if ctx.progress:
        what = (
            f"{res.value:.1f} {res.unit}" if res.value is not None else f"FAILED: {one_line(res.error or '')}"
        )
        tag = "warm-up" if is_warm else f"round {rnd - warmup + 1}/{pairs}"
        ctx.progress(f"{group.key} {tag} {v.key}: {what} ({res.wall_s:.1f} s)")
    if res.error:
        st.errors[v.key] = one_line(res.error)
        if res.finding and v.crash_finding:
            st.findings[v.key] = f"{v.crash_finding}: {one_line(res.error)}"
        workers.drop(v.key, "failed")
        return True
    if not is_warm:
        st.values[v.key][rnd - warmup] = res.value
    if v.key not in st.first:
        st.first[v.key] = res.record
        note = _first_record_note(group, v, res.record)
        if note:
            st.notes.setdefault(v.key, []).append(note)
    if group.tuning == "pillow" and len(st.first) == 2:
        a, b = (st.first.get(x.key) for x in group.variants[:2])
        err = proof.same_pil_error((a or {}).get("pil"), (b or {}).get("pil"))
        if err:  # the pairs so far compared a PIL with itself: none of them counts
            st.errors[group.variants[1].key] = err
            st.values[group.variants[1].key] = [None] * pairs
            workers.drop(group.variants[1].key, "failed")
    return True


def _first_record_note(group: Group, v: Variant, rec: dict) -> str | None:
    if group.tuning == "pillow":
        pil = rec.get("pil") or {}
        note = proof.describe_pil(pil) + f", libjpeg-turbo {pil.get('libjpeg_turbo')}"
        ymm = avx2_instructions(pil.get("imaging_so")) if pil.get("simd") else None
        return note + (
            f", AVX2 build: {'yes' if ymm else 'no'} ({ymm} ymm instructions)" if ymm is not None else ""
        )
    if group.tuning == "allocator" and v.key != "glibc":
        mapped = ", ".join((rec.get("allocator") or {}).get("mapped") or [])
        conf = (rec.get("allocator") or {}).get("malloc_conf")
        return f"mapped: {mapped}" + (f"; MALLOC_CONF={conf}" if conf else "")
    if group.tuning == "threads":
        return f"torch threads: {(rec.get('threads') or {}).get('torch')}"
    if group.tuning == "shm":
        used = rec.get("shm_used_bytes")
        used_s = f", {used / 2**20:.0f} MiB used with the queues full" if used is not None else ""
        return f"/dev/shm in the child: {rec.get('shm_bytes', 0) / 2**20:.0f} MiB{used_s}"
    return None


# ---------------------------------------------------------------------------------- preparation steps


def probe_python(ctx: Context) -> tuple[dict | None, str | None]:
    """The training Python's environment (worker task "probe"), or why it could not be read."""
    run = ctx.launcher(
        worker_argv(ctx.python, {"task": "probe"}, root=ctx.pyroot),
        variant_env(ctx),
        max(ctx.timeout, 60.0),
        "probe",
    )
    final = next((r for r in reversed(run.records) if "ok" in r), None)
    if run.error or not final or not final.get("ok"):
        why = (final or {}).get("error") or run.error or "no result"
        tail = run.stderr_tail.strip().splitlines()[-1:] if run.stderr_tail else []
        if tail and tail[0] not in why:
            why = f"{why} ({tail[0][:200]})"
        return None, why
    return final, None


def ensure_images(ctx: Context, count: int, size=(484, 402), quality: int = 90, seed: int = 0):
    """(folder, None) with at least ``count`` JPEGs, written once and reused; (None, why) on failure."""
    name = f"jpeg-{size[0]}x{size[1]}-q{quality}-seed{seed}"
    folder = os.path.join(ctx.workdir, name)
    marker = os.path.join(folder, "complete.json")
    try:  # the one reader: the workdir may be anyone's (--workdir), a link or FIFO there is not our marker
        done = json.loads(infile.read_text(marker, 4096, follow=False))
    except (infile.ReadError, ValueError, RecursionError):
        done = None
    images = done.get("images") if isinstance(done, dict) else None
    if isinstance(images, int) and not isinstance(images, bool) and images >= count:
        return folder, None
    os.makedirs(ctx.workdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=name + ".tmp-", dir=ctx.workdir)
    cfg = {
        "task": "images",
        "dir": tmp,
        "images": count,
        "size": list(size),
        "quality": quality,
        "seed": seed,
    }
    run = ctx.launcher(
        worker_argv(ctx.python, cfg, root=ctx.pyroot), variant_env(ctx), max(ctx.timeout, 300.0), "images"
    )
    final = next((r for r in reversed(run.records) if "ok" in r), {})
    if run.error or not final.get("ok"):
        shutil.rmtree(tmp, ignore_errors=True)
        return None, f"writing {count} JPEGs failed: {final.get('error') or run.error}"
    with open(os.path.join(tmp, "complete.json"), "w") as f:
        json.dump({"images": count, "size": list(size), "quality": quality, "seed": seed}, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder, None


def ensure_overlay(workdir: str, wheel: str) -> tuple[str | None, str | None]:
    """Unpack a wheel (a zip) into its own folder once; that folder goes first on the child's PYTHONPATH."""
    name = os.path.basename(wheel)[: -len(".whl")] if wheel.endswith(".whl") else os.path.basename(wheel)
    folder = os.path.join(workdir, "overlays", name)
    if os.path.exists(os.path.join(folder, ".complete")):
        return folder, None
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=name + ".tmp-", dir=os.path.dirname(folder))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        open(os.path.join(tmp, ".complete"), "w").close()
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except (OSError, zipfile.BadZipFile) as exc:
        return None, f"cannot unpack {wheel}: {exc}"
    return folder, None


@dataclass(frozen=True)
class BenchRun:
    comparisons: tuple[Comparison, ...]
    runs: tuple[RunResult, ...]
    #: Steps before the groups (images, overlays) that failed, as sentences.
    problems: tuple[str, ...] = ()
    #: Stopped by Ctrl-C: the comparisons are what was measured until then.
    interrupted: bool = False
    #: The worker processes (Server.info() with group and variant): pid, start-up, requests, how it ended.
    processes: tuple[dict[str, Any], ...] = ()


def run_plan(ctx: Context, plan: Plan, pairs: int, warmup: int, images: int, seed: int = 0) -> BenchRun:
    problems: list[str] = []
    cfg: dict[str, Any] = {}
    if any(g.workload in ("pipeline", "e2e") for g in plan.groups):
        count = max(g.config.get("images", 0) for g in plan.groups)
        folder, err = ensure_images(ctx, max(count, images), seed=seed)
        if err:
            problems.append(err)
        cfg["images_dir"] = folder or os.path.join(ctx.workdir, "missing-images")
    overlays: dict[str, str | None] = {}
    for g in plan.groups:
        for v in g.variants:
            if v.overlay_wheel and v.overlay_wheel not in overlays:
                overlays[v.overlay_wheel], err = ensure_overlay(ctx.workdir, v.overlay_wheel)
                if err:
                    problems.append(err)
    comparisons: list[Comparison] = []
    runs: list[RunResult] = []
    procs: list[dict[str, Any]] = []
    for g in plan.groups:
        try:
            comps, rr, pp = run_group(ctx, g, pairs, warmup, cfg, overlays)
        except Interrupted as stop:
            comparisons += stop.comparisons
            runs += stop.runs
            procs += stop.processes
            return BenchRun(tuple(comparisons), tuple(runs), tuple(problems), True, tuple(procs))
        comparisons += comps
        runs += rr
        procs += pp
    return BenchRun(tuple(comparisons), tuple(runs), tuple(problems), processes=tuple(procs))
