"""hostcheck.bench.run: orchestration with fake children (canned records, crashes, hangs, bad JSON) and the
checks that a run measured what it claims (allocator mapped, PIL overlay, /dev/shm size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from hostcheck.bench import proof
from hostcheck.bench import run as R
from hostcheck.bench.plan import Group, Plan, Variant
from hostcheck.bench.stats import HELPS, HURTS
from hostcheck.workload.runner import MARKER, ProbeRun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JE = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def ok_record(metric, **extra):
    return {"ok": True, "metric": metric, "unit": "img/s", **extra}


class FakeLauncher:
    """Answers each run from ``table[variant key]``: a number (the metric), a callable (round -> ProbeRun
    or number) or a ProbeRun. Records every launch."""

    def __init__(self, table, records=None):
        self.table = table
        self.records = records or {}
        self.calls = []

    def __call__(self, argv, env, timeout, name):
        key = name.split(":", 1)[1]
        self.calls.append((key, argv, env))
        n = sum(1 for k, _, _ in self.calls if k == key) - 1
        ans = self.table[key]
        if callable(ans):
            ans = ans(n)
        if isinstance(ans, ProbeRun):
            return ans
        rec = ok_record(ans, **self.records.get(key, {}))
        return ProbeRun(name=name, records=({"event": "start"}, rec))


def ctx(launcher, tmp_path, timeout=30.0):
    return R.Context("/venv/bin/python", {"PATH": "/usr/bin"}, "/shim", str(tmp_path), timeout, launcher)


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
    fake = FakeLauncher({k: (lambda n, k=k: seq[k][n]) for k in seq})
    comps, runs = R.run_group(ctx(fake, tmp_path), group(A, B, C), pairs=5, warmup=1, cfg={}, overlays={})
    order = "".join(k for k, _, _ in fake.calls)
    assert order == "abc" + "cba" + "abc" + "cba" + "abc" + "cba"
    assert len(runs) == 18 and [r.warmup for r in runs[:3]] == [True] * 3
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
    fake = FakeLauncher({"a": 100, "b": crash, "c": 150})
    comps, _ = R.run_group(ctx(fake, tmp_path), group(A, B, C), pairs=3, warmup=0, cfg={}, overlays={})
    b, c = comps
    assert b.status == R.ERROR and "boom" in b.message and b.verdict == "error"
    assert [k for k, _, _ in fake.calls].count("b") == 1  # dropped after its first failure
    assert c.status == R.MEASURED and c.summary.pairs == 3 and c.summary.ratio == pytest.approx(1.5)


def test_a_failed_baseline_ends_the_group(tmp_path):
    dead = ProbeRun(name="x", error="timed out after 5 s and was killed", timed_out=True)
    fake = FakeLauncher({"a": dead, "b": 100, "c": 100})
    comps, _ = R.run_group(ctx(fake, tmp_path), group(A, B, C), pairs=3, warmup=0, cfg={}, overlays={})
    assert [c.status for c in comps] == [R.ERROR, R.ERROR]
    assert "baseline (baseline) failed: timed out" in comps[0].message
    assert [k for k, _, _ in fake.calls] == ["a"]


def test_an_allocator_that_did_not_load_is_an_error(tmp_path):
    je = Variant(
        "jemalloc",
        "jemalloc",
        env={"LD_PRELOAD": JE},
        expect={"allocator": "jemalloc", "allocator_path": JE, "malloc_conf": ""},
    )
    glibc = Variant("glibc", "glibc", expect={"allocator": "glibc"})
    fake = FakeLauncher(
        {"glibc": 100, "jemalloc": 90},
        records={"glibc": {"allocator": {"mapped": []}}, "jemalloc": {"allocator": {"mapped": []}}},
    )
    comps, _ = R.run_group(
        ctx(fake, tmp_path), group(glibc, je, tuning="allocator"), pairs=2, warmup=0, cfg={}, overlays={}
    )
    assert comps[0].status == R.ERROR
    assert "LD_PRELOAD path did not load" in comps[0].message
    assert fake.calls[1][2]["LD_PRELOAD"] == JE


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
    fake = FakeLauncher({"a": 100, "b": 101}, records={"a": {"pil": pil}, "b": {"pil": pil}})
    comps, _ = R.run_group(ctx(fake, tmp_path), group(A, B, tuning="pillow"), 3, 0, {}, {})
    assert comps[0].status == R.ERROR and "both sides imported the same PIL" in comps[0].message
    assert len(fake.calls) == 2  # refused at once, not measured three times


def test_an_overlay_that_lost_to_the_installed_pil_is_an_error(tmp_path):
    stock = {"version": "13.0.0", "simd": False, "path": "/venv/PIL"}
    a = Variant("pillow", "Pillow", expect={"pil": "pillow"})
    b = Variant("pillow-simd", "pillow-simd", expect={"pil": "pillow-simd"}, overlay_wheel="/w/simd.whl")
    fake = FakeLauncher(
        {"pillow": 100, "pillow-simd": 130}, records={"pillow": {"pil": stock}, "pillow-simd": {"pil": stock}}
    )
    comps, _ = R.run_group(
        ctx(fake, tmp_path), group(a, b, tuning="pillow"), 2, 0, {}, {"/w/simd.whl": "/ov/simd"}
    )
    assert comps[0].status == R.ERROR and "overlay did not take effect" in comps[0].message
    # The overlay goes first on PYTHONPATH, hostcheck's shim after it.
    env_b = next(e for k, _, e in fake.calls if k == "pillow-simd")
    assert env_b["PYTHONPATH"].split(os.pathsep)[:2] == ["/ov/simd", "/shim"]
    # A wheel that could not be unpacked: an error, nothing launched for it.
    fake = FakeLauncher({"pillow": 100}, records={"pillow": {"pil": stock}})
    comps, _ = R.run_group(ctx(fake, tmp_path), group(a, b, tuning="pillow"), 2, 0, {}, {})
    assert "could not unpack /w/simd.whl" in comps[0].message


def test_a_small_shm_crash_is_a_finding_not_an_error(tmp_path):
    small = Variant(
        "shm-small", "/dev/shm 64M", shm_size="64M", crash_finding="a 64M /dev/shm breaks DataLoader workers"
    )
    large = Variant("shm-large", "/dev/shm 50%", shm_size="50%")
    bus = ProbeRun(
        name="x",
        records=({"event": "start"},),
        error="crashed (killed by signal SIGBUS)",
        rc=-7,
        stderr_tail="ERROR: Unexpected bus error encountered in worker.",
    )
    fake = FakeLauncher({"shm-small": bus, "shm-large": 200})
    comps, _ = R.run_group(ctx(fake, tmp_path), group(small, large, tuning="shm"), 3, 1, {}, {})
    (c,) = comps
    assert c.status == R.FINDING and c.verdict == HELPS
    assert c.message.startswith("a 64M /dev/shm breaks DataLoader workers: crashed (killed by signal SIGBUS)")
    assert c.b.values == (200, 200, 200)
    argv = fake.calls[0][1]
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"] and "64M" in argv
    # The same crash before the workload started (setup) is an error, and so is a failed mount.
    early = ProbeRun(name="x", error="crashed (exit 1): ImportError: torch", rc=1)
    comps, _ = R.run_group(
        ctx(FakeLauncher({"shm-small": early, "shm-large": 1}), tmp_path),
        group(small, large, tuning="shm"),
        2,
        0,
        {},
        {},
    )
    assert comps[0].status == R.ERROR
    mount = ProbeRun(name="x", error="crashed (exit 97)", rc=97, stderr_tail="mount: permission denied")
    comps, _ = R.run_group(
        ctx(FakeLauncher({"shm-small": mount, "shm-large": 1}), tmp_path),
        group(small, large, tuning="shm"),
        2,
        0,
        {},
        {},
    )
    assert comps[0].status == R.ERROR and "could not mount a 64M tmpfs" in comps[0].message


def test_ctrl_c_keeps_what_was_measured(tmp_path):
    def stop(n):
        if n == 2:
            raise KeyboardInterrupt
        return 120

    fake = FakeLauncher({"a": 100, "b": stop, "c": 90})
    g1 = group(A, B, workload="train")
    g2 = Group("threads/train", "threads", "train", "t", {"workload": "train"}, (A, C))
    plan = Plan((g1, g2), ())
    bench = R.run_plan(ctx(fake, tmp_path), plan, pairs=4, warmup=0, images=8)
    assert bench.interrupted and len(bench.comparisons) == 1
    (c,) = bench.comparisons
    assert c.b.values == (120, 120, None, None) and c.summary.pairs == 2
    assert [k for k, _, _ in fake.calls] == ["a", "b", "b", "a", "a", "b"]


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
    shim = R.pythonpath_root(str(tmp_path))
    assert os.listdir(shim) == ["hostcheck"]
    assert os.path.samefile(os.path.join(shim, "hostcheck"), os.path.join(ROOT, "hostcheck"))
    assert R.pythonpath_root(str(tmp_path)) == shim  # idempotent


def test_images_are_written_once_and_overlays_unpacked_once(tmp_path):
    calls = []

    def launcher(argv, env, timeout, name):
        cfg = json.loads(argv[-1])
        calls.append(cfg["task"])
        for i in range(cfg["images"]):
            open(os.path.join(cfg["dir"], f"img_{i:05d}.jpg"), "w").close()
        return ProbeRun(name=name, records=({"ok": True, "images": cfg["images"]},))

    c = ctx(launcher, tmp_path)
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


# ------------------------------------------------------------------------------ real child processes

FAKE_PYTHON = """#!{exe}
import json, os, sys, time
cfg = json.loads(sys.argv[-1])
mode = os.environ.get("FAKE_MODE", "ok")
M = {marker!r}
if mode == "crash":
    sys.stderr.write("Traceback (most recent call last):\\nRuntimeError: boom in the child\\n")
    sys.exit(1)
if mode == "hang":
    print(M + json.dumps({{"event": "start"}}), flush=True)
    time.sleep(60)
if mode == "badjson":
    print(M + "{{not json")
    sys.exit(0)
print(M + json.dumps({{"event": "start"}}))
print(M + json.dumps({{"ok": True, "metric": float(os.environ.get("FAKE_VALUE", "100")), "unit": "img/s"}}))
"""


@pytest.fixture
def fake_python(tmp_path):
    p = tmp_path / "python"
    p.write_text(FAKE_PYTHON.format(exe=sys.executable, marker=MARKER))
    p.chmod(0o755)
    return str(p)


def test_real_children_crash_hang_and_bad_json_become_errors(fake_python, tmp_path):
    vs = (
        Variant("a", "ok", env={"FAKE_VALUE": "100"}),
        Variant("crash", "crash", env={"FAKE_MODE": "crash"}),
        Variant("hang", "hang", env={"FAKE_MODE": "hang"}),
        Variant("bad", "bad", env={"FAKE_MODE": "badjson"}),
        Variant("b", "ok", env={"FAKE_VALUE": "150"}),
    )
    c = R.Context(fake_python, dict(os.environ), "/shim", str(tmp_path), 1.5, R.default_launcher)
    t0 = time.monotonic()
    comps, runs = R.run_group(c, group(*vs), pairs=2, warmup=0, cfg={}, overlays={})
    assert time.monotonic() - t0 < 20
    by = {x.b.key: x for x in comps}
    assert by["crash"].status == R.ERROR and "boom in the child" in by["crash"].message
    assert by["hang"].status == R.ERROR and "timed out after 1.5 s" in by["hang"].message
    assert by["bad"].status == R.ERROR and "bad JSON" in by["bad"].message
    assert by["b"].status == R.MEASURED and by["b"].summary.ratio == pytest.approx(1.5)
    crash_run = next(r for r in runs if r.variant == "crash")
    assert "boom in the child" in crash_run.stderr_tail


def test_real_worker_refuses_an_allocator_that_did_not_load():
    cfg = {
        "workload": "pipeline",
        "expect": {"allocator": "jemalloc", "allocator_path": "/nonexistent/libjemalloc.so.2"},
    }
    env = dict(os.environ, PYTHONPATH=ROOT, LD_PRELOAD="/nonexistent/libjemalloc.so.2")
    p = subprocess.run(
        [sys.executable, "-m", "hostcheck.bench.worker", json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
        check=False,
    )
    rec = json.loads(next(x for x in p.stdout.splitlines() if x.startswith(MARKER))[len(MARKER) :])
    assert p.returncode == 3 and rec["ok"] is False and rec["stage"] == "proof"
    assert "LD_PRELOAD path did not load: /nonexistent/libjemalloc.so.2" in rec["error"]


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
    code = "import json; from hostcheck.bench.worker import pil_info; print(json.dumps(pil_info()))"
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
    from hostcheck.bench import worker
    from hostcheck.workload.probes import write_jpegs

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
