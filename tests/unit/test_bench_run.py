"""hostcheck.bench.run and .server: orchestration with fake worker processes (in-process fakes with canned
answers; tiny Python scripts that serve canned JSON lines, hang, crash or print nonsense), and the checks that
a run measured what it claims (allocator mapped, PIL overlay, /dev/shm size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from hostcheck.bench import run as R
from hostcheck.bench.plan import Group, Plan, Variant
from hostcheck.bench.stats import HELPS, HURTS
from hostcheck.child.launch import BOOTSTRAP, MARKER, ProbeRun, pythonpath_root
from hostcheck.inside import proof

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JE = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def ok_record(metric, **extra):
    return {"ok": True, "metric": metric, "unit": "img/s", **extra}


class FakeWorker:
    """An in-process stand-in for hostcheck.child.session.Server."""

    def __init__(self, owner, key, argv, env, name):
        self.owner, self.key, self.argv, self.env, self.name = owner, key, argv, env, name
        self.pid = 1000 + len(owner.workers)
        self.requests = 0
        self.closed = None  # the grace it was closed with

    def hello(self, timeout):
        if self.key in self.owner.hellos:
            return self.owner.hellos[self.key]
        rec = {"event": "hello", "ok": True, **self.owner.records.get(self.key, {})}
        return ProbeRun(name=self.name, records=(rec,))

    def request(self, cfg, timeout):
        assert self.closed is None, f"{self.key}: request to a closed worker"
        self.owner.calls.append((self.key, self.argv, self.env))
        self.owner.configs.append((self.key, cfg))
        n = self.requests
        self.requests += 1
        ans = self.owner.table[self.key]
        if callable(ans):
            ans = ans(n)
        if isinstance(ans, ProbeRun):
            return ans
        rec = ok_record(ans, started=True, **self.owner.records.get(self.key, {}))
        return ProbeRun(name=self.name, records=(rec,))

    def end_input(self):
        pass

    def close(self, grace=3.0, reason=None):
        if self.closed is None:
            self.closed = grace

    def info(self):
        return {"name": self.name, "pid": self.pid, "requests": self.requests, "ended": "exit 0"}


class FakeWorkers:
    """Starts a FakeWorker per variant; each request is answered from ``table[variant key]``: a number (the
    metric), a callable (request index -> ProbeRun or number) or a ProbeRun. ``hellos[key]``: that worker's
    start-up (a ProbeRun) instead of a good one; ``records[key]``: fields of its hello and answers. Records
    every request as (key, argv, env)."""

    def __init__(self, table, records=None, hellos=None):
        self.table = table
        self.records = records or {}
        self.hellos = hellos or {}
        self.calls = []
        self.configs = []
        self.workers = []

    def __call__(self, argv, env, name):
        w = FakeWorker(self, name.split(":", 1)[1], argv, env, name)
        self.workers.append(w)
        return w

    def all_closed(self):
        return all(w.closed is not None for w in self.workers)


def ctx(workers, tmp_path, timeout=30.0, **kw):
    return R.Context(
        "/venv/bin/python",
        {"PATH": "/usr/bin"},
        "/shim",
        str(tmp_path),
        timeout,
        server_launcher=workers,
        **kw,
    )


def group(*variants, tuning="workers", workload="pipeline"):
    return Group(f"{tuning}/{workload}", tuning, workload, "test", {"workload": workload}, tuple(variants))


A = Variant("a", "baseline")
B = Variant("b", "tuning b")
C = Variant("c", "tuning c")


def test_rounds_are_mirrored_and_each_tuning_is_paired_with_its_rounds_baseline(tmp_path):
    seq = {
        "a": [100, 90, 110, 100, 105, 95],
        "b": [130, 120, 140, 135, 138, 125],
        "c": [70, 65, 80, 72, 74, 69],
    }
    fake = FakeWorkers({k: (lambda n, k=k: seq[k][n]) for k in seq})
    g = Group(
        "workers/pipeline", "workers", "pipeline", "t", {"workload": "pipeline", "images": 8}, (A, B, C)
    )
    comps, runs, procs = R.run_group(ctx(fake, tmp_path), g, pairs=5, warmup=1, cfg={"seed": 3}, overlays={})
    order = "".join(k for k, _, _ in fake.calls)
    assert order == "abc" + "cba" + "abc" + "cba" + "abc" + "cba"
    assert len(runs) == 18 and [r.warmup for r in runs[:3]] == [True] * 3
    # One worker per variant serves all its runs, started with --serve, ended with the group.
    assert [w.key for w in fake.workers] == ["a", "b", "c"] and fake.all_closed()
    assert all(w.argv[-2] == "--serve" and w.requests == 6 for w in fake.workers)
    assert json.loads(fake.workers[0].argv[-1]) == {"expect": {}}
    assert [r.request for r in runs if r.variant == "b"] == [1, 2, 3, 4, 5, 6]
    assert {r.pid for r in runs if r.variant == "b"} == {fake.workers[1].pid}
    assert [p["variant"] for p in procs] == ["a", "b", "c"] and procs[0]["group"] == "workers/pipeline"
    # Each request is the whole measurement config: group, shared and variant settings, the proofs.
    assert fake.configs[0][1] == {
        "workload": "pipeline",
        "images": 8,
        "seed": 3,
        "task": "measure",
        "expect": {},
    }
    b, c = comps
    assert b.status == R.MEASURED and b.b.values == (120, 140, 135, 138, 125)  # warm-up dropped
    assert b.a.values == (90, 110, 100, 105, 95)
    assert b.summary.ratio == pytest.approx(sorted([120 / 90, 140 / 110, 135 / 100, 138 / 105, 125 / 95])[2])
    assert b.verdict == HELPS and c.verdict == HURTS
    assert b.orders == ("BA", "AB", "BA", "AB", "BA")
    d = b.to_dict()
    assert d["pairs"][0] == {"round": 0, "a": 90, "b": 120, "ratio": pytest.approx(120 / 90), "order": "BA"}
    assert d["key"] == "workers/pipeline:b" and d["summary"]["pairs"] == 5
    json.dumps(d)


def test_a_crashing_variant_is_an_error_and_the_others_go_on(tmp_path):
    crash = ProbeRun(
        name="x", error="crashed (exit 1): RuntimeError: boom", rc=1, stderr_tail="RuntimeError: boom"
    )
    fake = FakeWorkers({"a": 100, "b": crash, "c": 150})
    comps, _, _ = R.run_group(ctx(fake, tmp_path), group(A, B, C), pairs=3, warmup=0, cfg={}, overlays={})
    b, c = comps
    assert b.status == R.ERROR and "boom" in b.message and b.verdict == "error"
    assert [k for k, _, _ in fake.calls].count("b") == 1  # dropped after its first failure
    assert fake.workers[1].closed is not None  # and its worker ended at once
    assert c.status == R.MEASURED and c.summary.pairs == 3 and c.summary.ratio == pytest.approx(1.5)


def test_a_failed_baseline_ends_the_group(tmp_path):
    dead = ProbeRun(name="x", error="timed out after 5 s and was killed", timed_out=True)
    fake = FakeWorkers({"a": dead, "b": 100, "c": 100})
    comps, _, _ = R.run_group(ctx(fake, tmp_path), group(A, B, C), pairs=3, warmup=0, cfg={}, overlays={})
    assert [c.status for c in comps] == [R.ERROR, R.ERROR]
    assert "baseline (baseline) failed: timed out" in comps[0].message
    assert [k for k, _, _ in fake.calls] == ["a"] and fake.all_closed()
    # A baseline whose worker did not start: the others are not waited for, nothing is measured.
    bad = ProbeRun(name="x", error="crashed (exit 1): ImportError: no torch", rc=1)
    fake = FakeWorkers({"a": 100, "b": 100, "c": 100}, hellos={"a": bad})
    comps, runs, _ = R.run_group(ctx(fake, tmp_path), group(A, B, C), 3, 1, {}, {})
    assert "the worker did not start: crashed (exit 1): ImportError: no torch" in comps[0].message
    assert fake.calls == [] and fake.all_closed() and len(runs) == 1 and runs[0].request == 0


def test_an_allocator_that_did_not_load_is_an_error(tmp_path):
    je = Variant(
        "jemalloc",
        "jemalloc",
        env={"LD_PRELOAD": JE},
        expect={"allocator": "jemalloc", "allocator_path": JE, "malloc_conf": ""},
    )
    glibc = Variant("glibc", "glibc", expect={"allocator": "glibc"})
    fake = FakeWorkers(
        {"glibc": 100, "jemalloc": 90},
        records={"glibc": {"allocator": {"mapped": []}}, "jemalloc": {"allocator": {"mapped": []}}},
    )
    comps, _, _ = R.run_group(
        ctx(fake, tmp_path), group(glibc, je, tuning="allocator"), pairs=2, warmup=0, cfg={}, overlays={}
    )
    assert comps[0].status == R.ERROR
    assert "LD_PRELOAD path did not load" in comps[0].message
    # Known from the worker's hello: it got no request, and it ran with the preload.
    assert [k for k, _, _ in fake.calls] == ["glibc"]
    assert fake.workers[1].env["LD_PRELOAD"] == JE and fake.workers[1].closed is not None
    # A worker whose hello was right but whose answer is not (every answer is checked too).
    late = {"allocator": {"mapped": [JE]}}
    fake = FakeWorkers(
        {"glibc": 100, "jemalloc": lambda n: 90 if n == 0 else ProbeRun(name="x", records=(ok_record(90),))},
        records={"glibc": {"allocator": {"mapped": []}}, "jemalloc": late},
    )
    comps, _, _ = R.run_group(ctx(fake, tmp_path), group(glibc, je, tuning="allocator"), 3, 0, {}, {})
    assert comps[0].status == R.MEASURED and comps[0].summary.pairs == 1
    assert "LD_PRELOAD path did not load" in comps[0].message


def test_allocator_proof_rules():
    assert proof.allocator_error("jemalloc", JE, ["/lib/x86_64-linux-gnu/libjemalloc.so.2"]) is None
    assert proof.allocator_error("glibc", None, ["/usr/lib/libc.so.6"]) is None
    assert "ld.so.preload" in proof.allocator_error("glibc", None, [JE])
    assert "did not load" in proof.allocator_error("tcmalloc", "/x/libtcmalloc.so.4", [JE])
    assert "did not load" in proof.allocator_error(
        "tcmalloc", "/x/libtcmalloc.so.4", ["/x/libtcmalloc_minimal.so.4"]
    )
    rec = {"allocator": {"mapped": [JE], "malloc_conf": None}, "threads": {"torch": 2}, "shm_bytes": 10}
    assert proof.check_record({"allocator": "jemalloc", "allocator_path": JE, "malloc_conf": ""}, rec) is None
    assert "MALLOC_CONF" in proof.check_record({"allocator": "jemalloc", "malloc_conf": "x:1"}, rec)
    assert "torch runs 2 threads" in proof.check_record({"threads": 1}, rec)
    assert "small tmpfs was not mounted" in proof.check_record({"shm_max_bytes": 5}, rec)


def test_the_same_pil_on_both_sides_is_refused(tmp_path):
    pil = {"version": "13.0.0", "simd": False, "path": "/venv/PIL"}
    fake = FakeWorkers({"a": 100, "b": 101}, records={"a": {"pil": pil}, "b": {"pil": pil}})
    comps, _, _ = R.run_group(ctx(fake, tmp_path), group(A, B, tuning="pillow"), 3, 0, {}, {})
    assert comps[0].status == R.ERROR and "both sides imported the same PIL" in comps[0].message
    assert len(fake.calls) == 2  # refused at once, not measured three times


def test_an_overlay_that_lost_to_the_installed_pil_is_an_error(tmp_path):
    stock = {"version": "13.0.0", "simd": False, "path": "/venv/PIL"}
    a = Variant("pillow", "Pillow", expect={"pil": "pillow"})
    b = Variant("pillow-simd", "pillow-simd", expect={"pil": "pillow-simd"}, overlay_wheel="/w/simd.whl")
    fake = FakeWorkers(
        {"pillow": 100, "pillow-simd": 130}, records={"pillow": {"pil": stock}, "pillow-simd": {"pil": stock}}
    )
    comps, _, _ = R.run_group(
        ctx(fake, tmp_path), group(a, b, tuning="pillow"), 2, 0, {}, {"/w/simd.whl": "/ov/simd"}
    )
    assert comps[0].status == R.ERROR and "overlay did not take effect" in comps[0].message
    assert [k for k, _, _ in fake.calls] == ["pillow"]  # known from the hello: never measured
    # The overlay goes first on PYTHONPATH, hostcheck's shim after it.
    env_b = fake.workers[1].env
    assert env_b["PYTHONPATH"].split(os.pathsep)[:2] == ["/ov/simd", "/shim"]
    # A wheel that could not be unpacked: an error, nothing launched for it.
    fake = FakeWorkers({"pillow": 100}, records={"pillow": {"pil": stock}})
    comps, _, _ = R.run_group(ctx(fake, tmp_path), group(a, b, tuning="pillow"), 2, 0, {}, {})
    assert "could not unpack /w/simd.whl" in comps[0].message
    assert [w.key for w in fake.workers] == ["pillow"] and fake.all_closed()


def test_a_small_shm_crash_is_a_finding_not_an_error(tmp_path):
    small = Variant(
        "shm-small", "/dev/shm 64M", shm_size="64M", crash_finding="a 64M /dev/shm breaks DataLoader workers"
    )
    large = Variant("shm-large", "/dev/shm 50%", shm_size="50%")
    # The small side's worker dies in a request (after its hello: torch imported, tmpfs mounted).
    bus = ProbeRun(
        name="x",
        error="crashed (killed by signal SIGBUS)",
        rc=-7,
        stderr_tail="ERROR: Unexpected bus error encountered in worker.",
    )
    fake = FakeWorkers({"shm-small": bus, "shm-large": 200})
    comps, _, _ = R.run_group(ctx(fake, tmp_path), group(small, large, tuning="shm"), 3, 1, {}, {})
    (c,) = comps
    assert c.status == R.FINDING and c.verdict == HELPS
    assert c.message.startswith("a 64M /dev/shm breaks DataLoader workers: crashed (killed by signal SIGBUS)")
    assert c.b.values == (200, 200, 200)
    argv = fake.calls[0][1]
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"] and "64M" in argv
    # The worker starts the one way code starts in the training Python (launch.inside_argv).
    assert argv[argv.index("64M") + 1 :][:6] == [
        "/venv/bin/python",
        "-c",
        BOOTSTRAP,
        "/shim",
        "hostcheck.inside.bench_worker",
        "--serve",
    ]
    # The DataLoader's error as an answer (the worker lives on): a finding once the workload had started...
    dl_error = {
        "ok": False,
        "error": "RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus error.",
    }
    started = ProbeRun(name="x", records=({**dl_error, "started": True},))
    comps, _, _ = R.run_group(
        ctx(FakeWorkers({"shm-small": started, "shm-large": 2}), tmp_path),
        group(small, large, tuning="shm"),
        2,
        0,
        {},
        {},
    )
    assert comps[0].status == R.FINDING and "killed by signal: Bus error" in comps[0].message
    # ... an error before it (setup), and so is a worker that did not start, or a failed mount.
    setup = ProbeRun(name="x", records=({**dl_error, "started": False},))
    early = ProbeRun(name="x", error="crashed (exit 1): ImportError: torch", rc=1)
    mount = ProbeRun(name="x", error="crashed (exit 97)", rc=97, stderr_tail="mount: permission denied")
    for table, hellos in (({"shm-small": setup}, {}), ({}, {"shm-small": early}), ({}, {"shm-small": mount})):
        fake = FakeWorkers({"shm-small": 1, "shm-large": 1, **table}, hellos=hellos)
        comps, _, _ = R.run_group(ctx(fake, tmp_path), group(small, large, tuning="shm"), 2, 0, {}, {})
        assert comps[0].status == R.ERROR and fake.all_closed()
    assert "could not mount a 64M tmpfs" in comps[0].message and "permission denied" in comps[0].message


def test_ctrl_c_keeps_what_was_measured(tmp_path):
    def stop(n):
        if n == 2:
            raise KeyboardInterrupt
        return 120

    fake = FakeWorkers({"a": 100, "b": stop, "c": 90})
    g1 = group(A, B, workload="train")
    g2 = Group("threads/train", "threads", "train", "t", {"workload": "train"}, (A, C))
    plan = Plan((g1, g2), ())
    bench = R.run_plan(ctx(fake, tmp_path), plan, pairs=4, warmup=0, images=8)
    assert bench.interrupted and len(bench.comparisons) == 1
    (c,) = bench.comparisons
    assert c.b.values == (120, 120, None, None) and c.summary.pairs == 2
    assert [k for k, _, _ in fake.calls] == ["a", "b", "b", "a", "a", "b"]
    # The group's workers were ended at once; the second group never started any.
    assert [(w.key, w.closed) for w in fake.workers] == [("a", 0.0), ("b", 0.0)]
    assert [p["variant"] for p in bench.processes] == ["a", "b"]


def test_judge_run_rejects_results_without_a_usable_metric():
    v = Variant("x", "x")
    assert R.judge_run(v, ProbeRun(name="x", records=({"ok": True},)))[1].startswith(
        "the result has no numeric"
    )
    assert R.judge_run(v, ProbeRun(name="x", records=({"ok": True, "metric": 0},)))[1] == "metric is 0.0"
    failed = ProbeRun(
        name="x", records=({"ok": False, "error": "proof failed"},), error="crashed (exit 3)", rc=3
    )
    assert R.judge_run(v, failed)[1] == "proof failed"


def test_clean_env_removes_tuning_variables_and_reports_them():
    keep, gone = R.clean_env(
        {
            "PATH": "/bin",
            "LD_PRELOAD": "/x.so",
            "MALLOC_CONF": "a:1",
            "OMP_NUM_THREADS": "4",
            "TCMALLOC_X": "1",
            "OMP_PLACES": "cores",
        }
    )
    assert keep == {"PATH": "/bin"}
    assert set(gone) == {"LD_PRELOAD", "MALLOC_CONF", "OMP_NUM_THREADS", "TCMALLOC_X", "OMP_PLACES"}
    c = R.Context("/py", {"PATH": "/bin", "PYTHONPATH": "/user"}, "/shim", "/w")
    env = R.variant_env(c, Variant("t", "t", env={"OMP_NUM_THREADS": "1"}), "/ov")
    assert env["PYTHONPATH"] == os.pathsep.join(["/ov", "/shim", "/user"])
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONUNBUFFERED"] == "1"


def test_pythonpath_shim_holds_only_hostcheck(tmp_path):
    shim = pythonpath_root(str(tmp_path))
    assert os.listdir(shim) == ["hostcheck"]
    assert os.path.samefile(os.path.join(shim, "hostcheck"), os.path.join(ROOT, "hostcheck"))
    assert pythonpath_root(str(tmp_path)) == shim  # idempotent


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda m: os.mkfifo(m), id="fifo"),
        pytest.param(lambda m: os.symlink("/dev/zero", m), id="symlink-to-dev-zero"),
        pytest.param(lambda m: Path(m).write_text("[1, 2]"), id="a-json-array"),
        pytest.param(lambda m: Path(m).write_text('{"images": "9999"}'), id="images-a-string"),
    ],
)
def test_a_hostile_images_marker_means_the_images_are_written_again(plant, tmp_path):
    calls = []

    def launcher(argv, env, timeout, name):
        cfg = json.loads(argv[-1])
        calls.append(cfg["task"])
        return ProbeRun(name=name, records=({"ok": True, "images": cfg["images"]},))

    c = ctx(None, tmp_path, launcher=launcher)
    folder = os.path.join(str(tmp_path), "jpeg-484x402-q90-seed0")
    os.makedirs(folder)
    plant(os.path.join(folder, "complete.json"))
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", R.ensure_images(c, 4)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "ensure_images blocked on the marker"
    assert box["r"] == (folder, None) and calls == ["images"]


def test_images_are_written_once_and_overlays_unpacked_once(tmp_path):
    calls = []

    def launcher(argv, env, timeout, name):
        cfg = json.loads(argv[-1])
        calls.append(cfg["task"])
        for i in range(cfg["images"]):
            open(os.path.join(cfg["dir"], f"img_{i:05d}.jpg"), "w").close()
        return ProbeRun(name=name, records=({"ok": True, "images": cfg["images"]},))

    c = ctx(None, tmp_path, launcher=launcher)
    folder, err = R.ensure_images(c, 4)
    assert err is None and len([f for f in os.listdir(folder) if f.endswith(".jpg")]) == 4
    assert R.ensure_images(c, 3) == (folder, None) and calls == ["images"]
    R.ensure_images(c, 8)
    assert calls == ["images", "images"]  # more images wanted: written again

    wheel = tmp_path / "pillow_simd-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("PIL/__init__.py", "__version__ = '1.0'\n")
    ov, err = R.ensure_overlay(str(tmp_path), str(wheel))
    assert err is None and os.path.isfile(os.path.join(ov, "PIL", "__init__.py"))
    assert R.ensure_overlay(str(tmp_path), str(wheel)) == (ov, None)
    bad = tmp_path / "bad.whl"
    bad.write_text("not a zip")
    assert R.ensure_overlay(str(tmp_path), str(bad))[1].startswith("cannot unpack")


# ------------------------------------------------------------------------- real worker processes

FAKE_SERVER = """#!{exe}
import json, os, signal, subprocess, sys, time
env = os.environ
key, mode, at = env.get("FAKE_KEY", "?"), env.get("FAKE_MODE", "ok"), int(env.get("FAKE_AT", "0"))


def note(pid):  # every process of this fake, for the no-process-left-behind checks
    open(os.path.join(env["FAKE_PIDS"], str(pid)), "w").close()


note(os.getpid())
if env.get("FAKE_CHILD"):  # stands for a DataLoader worker: a child in the server's process group
    note(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid)
assert sys.argv[-2] == "--serve", sys.argv
json.loads(sys.argv[-1])["expect"]
if mode == "slowhello":
    time.sleep(60)
if mode == "nohello":
    sys.stderr.write("Traceback (most recent call last):\\nImportError: no torch here\\n")
    sys.exit(1)
print(json.dumps({{"event": "hello", "ok": True, "pid": os.getpid()}}), flush=True)
n = 0
for line in sys.stdin:
    n += 1
    cfg = json.loads(line)
    with open(env["FAKE_LOG"], "a") as log:
        log.write(f"{{key}} {{n}} {{os.getpid()}}\\n")
    if n == at and mode == "hang":
        time.sleep(60)
    if n == at and mode == "crash":
        sys.stderr.write("Traceback (most recent call last):\\nRuntimeError: boom in the server\\n")
        sys.exit(1)
    if n == at and mode == "signal":
        os.kill(os.getpid(), signal.SIGBUS)
    if n == at and mode == "badjson":
        print("{{not json", flush=True)
        continue
    if n == at and mode == "chatty":  # 1 MB, far more than a pipe holds
        sys.stderr.write(("y" * 199 + "\\n") * 5000)
    print(json.dumps({{"ok": True, "metric": float(env.get("FAKE_VALUE", "100")), "unit": "img/s",
                      "started": True, "workload": cfg["workload"]}}), flush=True)
"""


@pytest.fixture
def fake_server(tmp_path):
    p = tmp_path / "python"
    p.write_text(FAKE_SERVER.format(exe=sys.executable))
    p.chmod(0o755)
    (tmp_path / "pids").mkdir()
    return str(p)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (/proc; a zombie's parent may be a container's init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def left_behind(tmp_path) -> list[int]:
    pids = [int(p) for p in os.listdir(tmp_path / "pids")]
    assert pids, "the fakes recorded no process"
    deadline = time.monotonic() + 2.0  # init may take a moment to reap what was killed
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def real_ctx(fake_server, tmp_path, timeout, **kw):
    env = dict(os.environ, FAKE_PIDS=str(tmp_path / "pids"), FAKE_LOG=str(tmp_path / "log"))
    return R.Context(fake_server, env, "/shim", str(tmp_path), timeout, **kw)


def fake_variant(key, **env):
    return Variant(key, key, env={"FAKE_KEY": key, **{k.upper(): str(v) for k, v in env.items()}})


def test_real_workers_hang_crash_and_bad_json_become_errors_and_the_others_go_on(fake_server, tmp_path):
    vs = (
        fake_variant("a", fake_value=100, fake_child=1),
        fake_variant("crash", fake_mode="crash", fake_at=2),
        fake_variant("hang", fake_mode="hang", fake_at=2, fake_child=1),
        fake_variant("bad", fake_mode="badjson", fake_at=1),
        fake_variant("sig", fake_mode="signal", fake_at=1),
        fake_variant("nohello", fake_mode="nohello"),
        fake_variant("slowhello", fake_mode="slowhello", fake_child=1),
        fake_variant("chatty", fake_mode="chatty", fake_at=1, fake_value=120),
        fake_variant("b", fake_value=150),
    )
    t0 = time.monotonic()
    comps, runs, procs = R.run_group(real_ctx(fake_server, tmp_path, 1.5), group(*vs), 3, 0, {}, {})
    assert time.monotonic() - t0 < 20
    by = {x.b.key: x for x in comps}
    # Died on its 2nd request: its first pair counts, then the error with its stderr's last line.
    assert by["crash"].b.values == (100, None, None)
    assert "crash failed: crashed (exit 1): RuntimeError: boom in the server" in by["crash"].message
    crash_run = next(r for r in runs if r.variant == "crash" and r.error)
    assert "Traceback" in crash_run.stderr_tail and "boom in the server" in crash_run.stderr_tail
    # Hung on its 2nd request: killed at the timeout, with its process group (the fake's child too).
    assert by["hang"].b.values[1:] == (None, None)
    assert "hang failed: timed out after 1.5 s" in by["hang"].message
    assert by["bad"].status == R.ERROR and "bad JSON from the worker" in by["bad"].message
    assert by["sig"].status == R.ERROR and "crashed (killed by signal SIGBUS)" in by["sig"].message
    assert by["nohello"].status == R.ERROR
    assert "the worker did not start: crashed (exit 1): ImportError: no torch here" in by["nohello"].message
    assert "the worker did not start: timed out after 1.5 s and was killed" in by["slowhello"].message
    assert by["chatty"].status == R.MEASURED and by["chatty"].summary.ratio == pytest.approx(1.2)
    assert by["b"].status == R.MEASURED and by["b"].summary.ratio == pytest.approx(1.5)
    # Each failing variant got no request after its failure; the others got all of theirs.
    log = (tmp_path / "log").read_text().split()
    assert [log[i] for i in range(0, len(log), 3)].count("crash") == 2
    assert [log[i] for i in range(0, len(log), 3)].count("b") == 3
    ended = {p["variant"]: p["ended"] for p in procs}
    assert ended["a"] == ended["b"] == "exit 0"
    assert ended["hang"] == "killed: timed out after 1.5 s" and ended["bad"] == "killed: bad JSON"
    assert ended["sig"] == "killed by signal SIGBUS" and ended["crash"] == "exit 1"
    assert ended["slowhello"] == "killed: timed out after 1.5 s"
    assert left_behind(tmp_path) == []


def test_real_workers_keep_the_abba_order_one_process_per_variant(fake_server, tmp_path):
    vs = (fake_variant("a", fake_value=100), fake_variant("b", fake_value=110))
    comps, runs, procs = R.run_group(real_ctx(fake_server, tmp_path, 10), group(*vs), 3, 1, {}, {})
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    assert [(k, int(n)) for k, n, _ in log] == [
        ("a", 1), ("b", 1),  # warm-up: each worker's first, cold measurement
        ("b", 2), ("a", 2),
        ("a", 3), ("b", 3),
        ("b", 4), ("a", 4),
    ]  # fmt: skip
    pids = {k: {p for kk, _, p in log if kk == k} for k in ("a", "b")}
    assert all(len(p) == 1 for p in pids.values()) and pids["a"] != pids["b"]
    assert {str(r.pid) for r in runs if r.variant == "a"} == pids["a"]
    assert [r.request for r in runs] == [1, 1, 2, 2, 3, 3, 4, 4]
    (c,) = comps
    assert c.orders == ("BA", "AB", "BA") and c.summary.pairs == 3
    assert [(p["variant"], p["requests"], p["ended"]) for p in procs] == [
        ("a", 4, "exit 0"),
        ("b", 4, "exit 0"),
    ]
    assert all(p["startup_s"] is not None for p in procs)
    assert left_behind(tmp_path) == []


def test_no_worker_is_left_after_a_failed_baseline_or_an_interrupt(fake_server, tmp_path):
    vs = (
        fake_variant("a", fake_mode="crash", fake_at=1, fake_child=1),
        fake_variant("b", fake_child=1),
        fake_variant("c", fake_child=1),
    )
    comps, runs, _ = R.run_group(real_ctx(fake_server, tmp_path, 10), group(*vs), 3, 1, {}, {})
    assert [c.status for c in comps] == [R.ERROR, R.ERROR] and len(runs) == 1
    assert left_behind(tmp_path) == []

    def ctrl_c(line):
        if line.startswith("workers/pipeline round 1/3 b"):
            raise KeyboardInterrupt

    vs = tuple(fake_variant(k, fake_child=1, fake_value=100) for k in "abc")
    c = real_ctx(fake_server, tmp_path, 10, progress=ctrl_c)
    with pytest.raises(R.Interrupted) as stop:
        R.run_group(c, group(*vs), 3, 1, {}, {})
    assert [r.variant for r in stop.value.runs] == ["a", "b", "c", "c", "b"]
    assert len(stop.value.comparisons) == 2 and stop.value.comparisons[1].b.values == (100, None, None)
    assert len(stop.value.processes) == 3
    assert {p["ended"] for p in stop.value.processes} <= {"killed: interrupted", "exit 0"}
    assert left_behind(tmp_path) == []


def test_real_worker_serves_requests_until_eof(tmp_path):
    """The real ``--serve`` loop: hello with its proofs, a bad request answered (and served on), a measurement,
    exit 0 at EOF."""
    pytest.importorskip("torch")
    from hostcheck.child.session import Server

    argv = [
        sys.executable,
        "-m",
        "hostcheck.inside.bench_worker",
        "--serve",
        json.dumps({"expect": {"allocator": "glibc"}}),
    ]
    s = Server(argv, dict(os.environ, PYTHONPATH=ROOT), "t")
    try:
        hello = s.hello(60).records[0]
        assert hello["event"] == "hello" and hello["ok"] and hello["pid"] == s.pid and hello["torch"]
        assert proof.check_record({"allocator": "glibc"}, hello) is None and hello["threads"]["torch"] >= 1
        bad = s.request({"workload": "nonsense"}, 30)
        assert bad.error is None and bad.records[0]["ok"] is False and bad.records[0]["started"] is False
        assert "KeyError" in bad.records[0]["error"]
        tiny = {"workload": "train", "batch": 2, "size": 8, "channels": [2], "measure_s": 0.0, "min_steps": 1}
        run = s.request(dict(tiny, warmup_steps=0, device="cpu", expect={"allocator": "glibc"}), 60)
        rec = run.records[0]
        assert rec["ok"] and rec["started"] and rec["request"] == 2 and rec["metric"] > 0, rec
    finally:
        s.close()
    assert s.ended == "exit 0" and s.requests == 2 and not alive(s.pid)


def test_the_answer_channel_keeps_stray_stdout_out_of_the_answers():
    code = (
        "import os, sys; from hostcheck.inside import bench_worker as worker; out = worker._answer_channel(); "
        "print('noise from print'); os.write(1, b'noise from C\\n'); worker._answer(out, {'ok': True})"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd="/",
        timeout=60,
        check=True,
    )
    assert p.stdout == '{"ok": true}\n'
    assert "noise from print" in p.stderr and "noise from C" in p.stderr


def test_real_worker_refuses_an_allocator_that_did_not_load():
    cfg = {
        "workload": "pipeline",
        "expect": {"allocator": "jemalloc", "allocator_path": "/nonexistent/libjemalloc.so.2"},
    }
    env = dict(os.environ, PYTHONPATH=ROOT, LD_PRELOAD="/nonexistent/libjemalloc.so.2")

    def worker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hostcheck.inside.bench_worker", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            timeout=60,
            check=False,
            input="",
        )

    p = worker(json.dumps(cfg))
    rec = json.loads(next(x for x in p.stdout.splitlines() if x.startswith(MARKER))[len(MARKER) :])
    assert p.returncode == 3 and rec["ok"] is False and rec["stage"] == "proof"
    assert "LD_PRELOAD path did not load: /nonexistent/libjemalloc.so.2" in rec["error"]
    # Serving: the same proof fails the hello, before torch is imported.
    p = worker("--serve", json.dumps({"expect": cfg["expect"]}))
    rec = json.loads(p.stdout)
    assert p.returncode == 3 and rec["event"] == "hello" and rec["ok"] is False and rec["stage"] == "proof"
    assert "LD_PRELOAD path did not load" in rec["error"]


def _fake_pil(root, dist, version):
    pil = root / "PIL"
    pil.mkdir(parents=True)
    (pil / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pil / "Image.py").write_text("")
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text("PIL/__init__.py,,\nPIL/Image.py,,\n")


def _pil_info(*paths):
    code = "import json; from hostcheck.inside.bench_worker import pil_info; print(json.dumps(pil_info()))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, paths), ROOT]))
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", check=True
    )
    return json.loads(p.stdout)


def test_pil_detection_follows_the_imported_package_not_the_installed_names(tmp_path):
    simd, stock = tmp_path / "simd", tmp_path / "stock"
    _fake_pil(simd, "pillow-simd", "12.1.1.post0")
    _fake_pil(stock, "pillow", "13.0.0")
    got = _pil_info(simd)
    assert got["simd"] is True and got["owner"] == "pillow-simd" and got["path"] == str(simd / "PIL")
    # Both distributions listed, but PIL/ comes from stock Pillow (a later install overwrote it).
    got = _pil_info(stock, simd)
    assert (
        got["simd"] is False and got["dists"]["pillow-simd"] == "12.1.1.post0" and got["version"] == "13.0.0"
    )
    assert proof.same_pil_error(_pil_info(stock), got) is not None
    assert proof.same_pil_error(_pil_info(simd), got) is None


def test_worker_workloads_in_process_on_tiny_sizes(tmp_path):
    """The measuring code itself (the real runs are children; here it runs in the test process)."""
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    from hostcheck.inside import bench_worker as worker
    from hostcheck.inside.fixtures import write_jpegs

    write_jpegs(str(tmp_path), 6, size=(64, 48))
    tiny = {"images_dir": str(tmp_path), "images": 6, "batch": 3, "channels": [4], "size": 16, "crop": 24}
    tiny.update(measure_s=0.01, min_steps=2, warmup_steps=1, device="cpu", warmup_images=1)
    for workload, workers in (("pipeline", 0), ("pipeline", 1), ("train", 0), ("e2e", 0)):
        rec = worker.task_measure(
            dict(tiny, workload=workload, workers=workers, expect={"allocator": "glibc"})
        )
        assert rec["ok"] and rec["metric"] > 0 and rec["unit"] == "img/s", rec
        assert rec["workload"] == workload and rec["device"] == "cpu" and rec["threads"]["torch"] >= 1
        assert proof.check_record({"allocator": "glibc"}, rec) is None
        if workload == "pipeline":
            assert rec["items"] == 6 and rec["pil"]["version"]
    assert worker.task_measure(dict(tiny, workload="train"))["steps"] >= 2
    with pytest.raises(RuntimeError, match="holds 6 JPEGs, not 7"):
        worker.task_measure(dict(tiny, workload="pipeline", images=7))
    probe = worker.task_probe({})
    assert probe["torch"]["version"] and probe["tag"].startswith("cp3") and probe["threads"]["torch"] >= 1


def test_the_workload_probe_runs_where_the_training_venv_lacks_hostcheck_or_has_another(tmp_path):
    """hostcheck.inside.workload starts the one way (launch.inside_argv/inside_env) in the training Python, which
    may lack hostcheck or hold another one: the PYTHONPATH folder with only our package comes first. Here the
    environment's own PYTHONPATH holds a hostcheck that fails on import, and the child starts in /."""
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    from hostcheck.child.launch import inside_argv, inside_env

    other = tmp_path / "hostcheck"
    other.mkdir()
    (other / "__init__.py").write_text('raise ImportError("the other hostcheck")\n')
    args = {"device": "cpu", "images": 8, "batch": 4, "crop": 32, "size": [96, 80], "workers": [0, 1]}
    env = inside_env(dict(os.environ, PYTHONPATH=str(tmp_path)))
    argv = inside_argv(sys.executable, "workload", "dataloader", "--json-args", json.dumps(args))
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(next(x for x in p.stdout.splitlines() if x.startswith(MARKER))[len(MARKER) :])
    assert rec["ok"], rec
    data = rec["data"]
    assert {w: r.get("images") for w, r in data["results"].items()} == {"0": 8, "1": 8}, data
    assert data["recommended_workers"] >= 1 and data["shm_bytes"]
    blocked = subprocess.run(
        [sys.executable, "-c", "import hostcheck"],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
        cwd="/",
        check=False,
    )
    assert blocked.returncode != 0  # the other hostcheck does fail on import


def test_the_bench_worker_reports_its_environment_through_the_environment_probe():
    """One probe of the environment inside: the bench worker's PIL/allocator/threads readers are
    hostcheck.inside.probe's, and the records keep their keys."""
    from hostcheck.inside import bench_worker as worker
    from hostcheck.inside import fixtures, probe

    assert worker.pil_info is probe.pil_info and worker.threads_info is probe.threads_info
    assert worker.JpegDataset is fixtures.JpegDataset and worker.shm_bytes is fixtures.shm_bytes
    alloc = worker.allocator_info([JE, "/usr/lib/libc.so.6", "/opt/lib/libtcmalloc_minimal.so.4"])
    assert alloc["mapped"] == [JE, "/opt/lib/libtcmalloc_minimal.so.4"]
    assert set(alloc) == {"mapped", "ld_preload", "malloc_conf"}
    assert set(worker.pil_info()) >= {"version", "simd", "path", "dists", "owner"}
    rec = worker.task_probe({})
    assert {"cpus", "pil", "allocator", "shm_bytes", "env"} <= set(rec)
    if rec.get("torch"):
        assert set(rec["threads"]) == {"torch", "omp_env", "openmp", "cpus"}


def test_closing_workers_cut_short_by_ctrl_c_kills_them_all():
    from hostcheck.child.session import close_all

    class Slow:
        def __init__(self, interrupt):
            self.interrupt, self.graces = interrupt, []

        def end_input(self):
            pass

        def close(self, grace=3.0, reason=None):
            self.graces.append(grace)
            if self.interrupt and len(self.graces) == 1:
                raise KeyboardInterrupt

    workers = [Slow(False), Slow(True), Slow(False)]
    with pytest.raises(KeyboardInterrupt):
        close_all(workers)
    assert [w.graces[-1] for w in workers] == [0.0, 0.0, 0.0]
