"""hostcheck.bench.plan and .discover: comparisons built from injected discovery results, never this host's."""

from __future__ import annotations

import os
import zipfile

import pytest

from hostcheck.bench import discover as D
from hostcheck.bench import plan as P
from hostcheck.gather.base import CmdResult

STOCK = {"version": "13.0.0", "simd": False, "path": "/venv/PIL"}
SIMD = {"version": "12.1.1.post0", "simd": True, "path": "/venv/PIL"}
SIMD_WHEEL = "/var/cache/gpunode/wheels/pillow-simd-12.1.1.post0-cp311-avx2/pillow_simd-12.1.1.post0-cp311-cp311-linux_x86_64.whl"
STOCK_WHEEL = "/w/pillow-13.0.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
ALL_LIBS = {
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "tcmalloc_minimal": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
}


def env(**kw):
    base = {
        "cpus": 2,
        "physical_cores": 2,
        "gpus": 0,
        "python_tag": "cp311",
        "machine": "x86_64",
        "os_family": "debian",
        "mem_total": 24 << 30,
        "pil": STOCK,
        "allocators": dict(ALL_LIBS),
        "wheels": (SIMD_WHEEL,),
        "shm_ok": True,
    }
    base.update(kw)
    return P.BenchEnv(**base)


def groups(plan):
    return {g.key: g for g in plan.groups}


def test_full_plan_on_a_2_core_cpu_node():
    plan = P.build_plan(env(), P.PlanOptions())
    g = groups(plan)
    assert list(g) == [
        "pillow/pipeline-0w",
        "pillow/pipeline-1w",
        "allocator/pipeline",
        "allocator/train",
        "threads/train",
        "workers/pipeline",
        "workers/e2e",
        "persistent_workers/pipeline",
        "shm/pipeline",
    ]
    # No GPU: pin_memory is skipped, with the reason.
    assert [s.tuning for s in plan.skips] == ["pin_memory"]
    assert "accelerator" in plan.skips[0].reason
    alloc = g["allocator/train"].variants
    assert [v.key for v in alloc] == [
        "glibc",
        "jemalloc",
        "jemalloc-guide",
        "jemalloc-decay",
        "tcmalloc",
        "tcmalloc_minimal",
    ]
    assert alloc[0].env == {} and alloc[0].expect == {"allocator": "glibc"}
    assert alloc[2].env["MALLOC_CONF"] == P.JEMALLOC_GUIDE_CONF
    assert (
        "background_thread:true" in P.JEMALLOC_GUIDE_CONF and "oversize_threshold:1" in P.JEMALLOC_GUIDE_CONF
    )
    assert alloc[3].env == {
        "LD_PRELOAD": ALL_LIBS["jemalloc"],
        "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1",
    }
    assert alloc[5].expect == {
        "allocator": "tcmalloc_minimal",
        "allocator_path": ALL_LIBS["tcmalloc_minimal"],
    }
    assert g["allocator/pipeline"].config["workers"] == 0
    # Threads: unset vs 1 vs the role's automatic value (2 physical cores, no GPU).
    assert [v.key for v in g["threads/train"].variants] == ["unset", "omp-1", "omp-2"]
    assert g["threads/train"].variants[1].env["OMP_NUM_THREADS"] == "1"
    assert [v.config["workers"] for v in g["workers/pipeline"].variants] == [0, 1, 2]
    shm = g["shm/pipeline"]
    assert shm.config["workers"] == 2 and shm.variants[0].shm_size == "64M"
    assert shm.variants[0].crash_finding and shm.variants[1].crash_finding is None
    assert shm.variants[0].expect["shm_max_bytes"] == 65 << 20
    assert plan.processes() == sum(len(x.variants) for x in plan.groups) == 28
    assert plan.runs(5, 1) == plan.processes() * 6


def test_pillow_simd_overlay_when_stock_pillow_is_installed():
    g = groups(P.build_plan(env(), P.PlanOptions(only=("pillow",))))
    assert list(g) == ["pillow/pipeline-0w", "pillow/pipeline-1w"]
    a, b = g["pillow/pipeline-0w"].variants
    assert a.overlay_wheel is None and a.expect == {"pil": "pillow"} and "installed" in a.label
    assert b.overlay_wheel == SIMD_WHEEL and b.expect == {"pil": "pillow-simd"}


def test_stock_pillow_overlay_when_pillow_simd_is_installed():
    plan = P.build_plan(env(pil=SIMD, wheels=(SIMD_WHEEL, STOCK_WHEEL)), P.PlanOptions(only=("pillow",)))
    a, b = plan.groups[0].variants
    assert a.overlay_wheel == STOCK_WHEEL and a.expect == {"pil": "pillow"}
    assert b.overlay_wheel is None and b.expect == {"pil": "pillow-simd"}


@pytest.mark.parametrize(
    ("pil", "wheels", "needle"),
    [
        (STOCK, (), "no pillow-simd wheel for cp311"),
        (SIMD, (SIMD_WHEEL,), "no stock Pillow wheel for cp311"),
        # A wheel for another Python does not fit.
        (STOCK, (SIMD_WHEEL.replace("cp311", "cp312"),), "no pillow-simd wheel"),
    ],
)
def test_pillow_skipped_without_the_other_wheel(pil, wheels, needle):
    plan = P.build_plan(env(pil=pil, wheels=wheels), P.PlanOptions(only=("pillow",)))
    assert plan.groups == ()
    (skip,) = plan.skips
    assert needle in skip.reason and "--pillow" in skip.hint


def test_missing_allocators_are_skipped_with_the_package_to_install():
    plan = P.build_plan(
        env(
            allocators={"jemalloc": None, "tcmalloc": None, "tcmalloc_minimal": ALL_LIBS["tcmalloc_minimal"]}
        ),
        P.PlanOptions(only=("allocator",)),
    )
    assert [v.key for v in plan.groups[0].variants] == ["glibc", "tcmalloc_minimal"]
    hints = {s.what: s.hint for s in plan.skips}
    assert hints["jemalloc"] == "apt-get install libjemalloc2"
    assert "libgoogle-perftools4" in hints["tcmalloc"]
    el = P.build_plan(
        env(os_family="redhat", allocators={}),
        P.PlanOptions(only=("allocator",)),
    )
    assert el.groups == ()
    assert {s.hint for s in el.skips} == {"dnf install jemalloc (EPEL)", "dnf install gperftools-libs (EPEL)"}


def test_no_pil_skips_the_pipeline_but_keeps_the_training_step():
    plan = P.build_plan(env(pil={"version": None, "error": "No module named 'PIL'"}), P.PlanOptions())
    assert [g.key for g in plan.groups] == ["allocator/train", "threads/train"]
    tunings = {s.tuning for s in plan.skips if "cannot import PIL" in s.reason}
    assert tunings == {"pillow", "allocator", "workers", "persistent_workers", "shm"}


def test_shm_skipped_without_mount_rights():
    plan = P.build_plan(env(shm_ok=False, shm_reason="needs root"), P.PlanOptions(only=("shm",)))
    assert plan.groups == ()
    assert plan.skips[0].reason == "needs root" and "CAP_SYS_ADMIN" in plan.skips[0].hint


def test_gpu_node_gets_pin_memory_and_the_gpu_training_sizes():
    e = env(cpus=64, physical_cores=32, gpus=8)
    g = groups(P.build_plan(e, P.PlanOptions(skip=("pillow",))))
    assert "pin_memory/pipeline" in g
    rec = g["pin_memory/pipeline"].config["workers"]
    assert rec == 7  # 64 CPUs / 8 GPUs, less one
    assert [v.config["pin_memory"] for v in g["pin_memory/pipeline"].variants] == [False, True]
    assert g["allocator/train"].config["device"] == "cuda" and g["allocator/train"].config["size"] == 224
    assert P.thread_counts(e) == [1, 4, 8]
    assert P.worker_counts(e) == [1, 2, 4, 7, 8]
    # Epochs long enough for 8 workers (4 batches each), unless --images was given.
    assert g["workers/pipeline"].config["images"] == 32 * 4 * 8
    assert g["allocator/pipeline"].config["images"] == 192
    assert g["shm/pipeline"].config["images"] == 32 * (2 * 7 + 2)
    fixed = groups(P.build_plan(e, P.PlanOptions(only=("workers",), images=64, scale_images=False)))
    assert fixed["workers/pipeline"].config["images"] == 64


def test_only_and_skip_and_quick():
    assert [g.tuning for g in P.build_plan(env(), P.PlanOptions(only=("threads",))).groups] == ["threads"]
    keys = [g.key for g in P.build_plan(env(), P.PlanOptions(skip=("pillow", "allocator", "shm"))).groups]
    assert keys == ["threads/train", "workers/pipeline", "workers/e2e", "persistent_workers/pipeline"]
    quick = P.build_plan(env(), P.PlanOptions(only=("workers",), quick=True))
    assert [g.key for g in quick.groups] == ["workers/pipeline"]


def test_wheel_names_and_picking():
    w = P.parse_wheel_name(STOCK_WHEEL)
    assert w["dist"] == "pillow" and w["ver"] == "13.0.0" and w["py"] == "cp311"
    assert P.wheel_fits(SIMD_WHEEL, "pillow_simd", "cp311", "x86_64")
    assert not P.wheel_fits(SIMD_WHEEL, "pillow_simd", "cp311", "aarch64")
    assert not P.wheel_fits(SIMD_WHEEL, "pillow", "cp311", "x86_64")
    sse = "/c/pillow-simd-12.1.1.post0-cp311-default/pillow_simd-12.1.1.post0-cp311-cp311-linux_x86_64.whl"
    old = "/c/pillow_simd-9.5.0.post2-cp311-cp311-linux_x86_64.whl"
    assert P.pick_wheel((sse, SIMD_WHEEL, old), "pillow_simd", "cp311", "x86_64") == SIMD_WHEEL
    assert P.pick_wheel((sse, old), "pillow_simd", "cp311", "x86_64") == sse
    assert P.pick_wheel((STOCK_WHEEL,), "pillow_simd", "cp311", "x86_64") is None
    abi3 = "/w/pillow-11.0.0-cp39-abi3-manylinux_2_28_x86_64.whl"
    assert P.wheel_fits(abi3, "pillow", "cp311", "x86_64")
    assert not P.wheel_fits(abi3, "pillow", "cp38", "x86_64")


def test_shm_sizes():
    assert P.shm_size_bytes("64M") == 64 << 20
    assert P.shm_size_bytes("2g") == 2 << 30
    assert P.shm_size_bytes("1024") == 1024
    assert P.shm_size_bytes("50%", 8 << 30) == 4 << 30
    assert P.shm_size_bytes("50%") is None
    with pytest.raises(ValueError):
        P.shm_size_bytes("64MB")


# ---------------------------------------------------------------------------------------------- discovery

LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibtcmalloc_minimal.so.4 (libc6) => /usr/lib/i386-linux-gnu/libtcmalloc_minimal.so.4
\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
\tlibtcmalloc_minimal_debug.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc_minimal_debug.so.4
\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2
"""


def test_parse_ldconfig_prefers_the_native_abi():
    t = D.parse_ldconfig(LDCONFIG, "x86_64")
    assert t["libtcmalloc_minimal.so.4"] == "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    assert t["libjemalloc.so.2"] == "/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert "libtcmalloc.so.4" not in t


def test_find_allocators_through_an_injected_runner(monkeypatch):
    monkeypatch.setattr(D, "find_allocator_libs", lambda: {"jemalloc": (), "tcmalloc": ()})
    found = D.find_allocators("x86_64", runner=lambda argv, t: CmdResult(0, LDCONFIG, ""))
    assert found == {
        "jemalloc": "/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "tcmalloc": None,
        "tcmalloc_minimal": "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    }


def test_shm_capability_reasons():
    root_caps = "Name:\tx\nCapEff:\t000001ffffffffff\n"
    no_admin = "CapEff:\t00000000a80425fb\n"
    assert D.shm_capability(0, root_caps, "/usr/bin/unshare") == (True, "")
    assert D.shm_capability(1000, root_caps, "/usr/bin/unshare")[1].startswith("needs root")
    assert "CAP_SYS_ADMIN" in D.shm_capability(0, no_admin, "/usr/bin/unshare")[1]
    assert "unshare" in D.shm_capability(0, root_caps, "")[1]


def test_os_family():
    assert D.os_family("ID=ubuntu\nID_LIKE=debian\n") == "debian"
    assert D.os_family('ID="rocky"\nID_LIKE="rhel centos fedora"\n') == "redhat"
    assert D.os_family("ID=arch\n") == ""


def test_find_wheels_looks_two_levels_down(tmp_path):
    sub = tmp_path / "pillow-simd-12.1.1.post0-cp311-avx2"
    sub.mkdir()
    w = sub / "pillow_simd-12.1.1.post0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("PIL/__init__.py", "")
    found = D.find_wheels([None], (str(tmp_path),))
    assert found == (str(w),)
    assert D.find_wheels([str(w)], (str(tmp_path),)) == (str(w),)  # no duplicates
    assert D.find_wheels([], (os.path.join(str(tmp_path), "missing"),)) == ()


def test_recommended_workers_is_one_rule_on_both_sides():
    """The planner's rule and the training-side one (hostcheck.inside.fixtures, which the workload probe imports
    in the training Python) must agree; the orchestrator imports nothing of hostcheck.inside, so only this test sees both."""
    from hostcheck.inside import fixtures

    cases = {(2, 1): 1, (16, 1): 8, (96, 8): 8, (32, 8): 3, (1, 0): 1}
    assert {k: P.recommended_workers(*k) for k in cases} == cases
    for cpus in range(0, 130):
        for gpus in range(0, 9):
            assert P.recommended_workers(cpus, gpus) == fixtures.recommended_workers(cpus, gpus), (cpus, gpus)


def test_the_bench_and_the_launcher_import_nothing_of_hostcheck_inside():
    """Import direction: hostcheck.inside runs in the training Python (``-m`` with hostcheck on its PYTHONPATH);
    the orchestrator's modules import none of it but the pure proofs (hostcheck.inside.proof, which the worker
    runs too). Checked in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys; import hostcheck.bench.plan, hostcheck.bench.discover, hostcheck.bench.run, "
        "hostcheck.inside.proof, hostcheck.bench.chart, hostcheck.child.launch, hostcheck.child.session, "
        "hostcheck.gather.torchinfo; print(sorted(m for m in sys.modules if m.startswith('hostcheck.inside')))"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=root),
        cwd="/",
        timeout=60,
        check=True,
    )
    assert p.stdout.strip() == "['hostcheck.inside', 'hostcheck.inside.proof']"
