"""Whole-node scenarios judged from fixtures: assert on results (status, value), never on printed text."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hostcheck_scenarios as S
import pytest

from hostcheck import fixes
from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.base import NOT_FOUND, Unavailable
from hostcheck.gather.nvml import gather_nvml
from hostcheck.registry import Status

ROOT = Path(__file__).resolve().parents[2]

BAD = (Status.FAIL, Status.ERROR)


def judge(snapshot, **kw):
    # The core's checks; the workload checks are judged from recorded runs in test_checks_workload.py.
    core = [c for c in all_checks() if c.category != "workload"]
    results, verdict = evaluate(snapshot, core, **kw)
    return {r.id: r for r in results}, verdict


def bad_ids(results):
    return {i for i, r in results.items() if r.status in BAD}


@pytest.mark.parametrize("name", sorted(S.SCENARIOS))
def test_scenario_fails_exactly_the_expected_checks(name):
    factory, expected_fails = S.SCENARIOS[name]
    results, verdict = judge(factory())
    assert bad_ids(results) == expected_fails
    assert verdict.ready is (not expected_fails)
    for rid in expected_fails:
        assert results[rid].hint, f"{rid} must name a fix"


def test_healthy_node_scores_100_and_is_ready(healthy):
    results, verdict = judge(healthy)
    assert verdict.score == 100 and verdict.ready
    statuses = {r.status for r in results.values()}
    assert statuses <= {Status.PASS, Status.SKIP}
    assert results["gpu.E006"].status == Status.SKIP  # H100: page retirement replaced by row remapping
    assert results["gpu.E002"].value == 8 and results["gpu.E002"].expected == 8
    assert results["torch.E003"].value == "sm_90"
    assert results["tuning.E005"].value == 14


def test_one_gpu_missing_reports_count(scenarios):
    results, _ = judge(S.SCENARIOS["one_gpu_missing"][0]())
    r = results["gpu.E002"]
    assert (r.value, r.expected) == (7, 8)


def test_expect_gpus_option_overrides_facts():
    snap = S.make_snapshot(options=Options(expect_gpus=4))
    results, _ = judge(snap)
    assert results["gpu.E002"].status == Status.WARN and results["gpu.E002"].expected == 4


def test_no_gpu_without_expectation_still_fails():
    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_driver"}
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=[]), facts=facts))
    assert results["gpu.E002"].status == Status.FAIL and results["gpu.E002"].value == 0
    for rid in ("gpu.E003", "gpu.E004", "gpu.E005", "gpu.E007", "gpu.E009"):
        assert results[rid].status == Status.SKIP


def test_pcie_x8_names_the_gpu():
    results, _ = judge(S.SCENARIOS["pcie_x8"][0]())
    r = results["gpu.E007"]
    assert r.status == Status.FAIL and "GPU 3" in r.message and "x8" in r.message


def test_pcie_gen_below_max_is_only_a_warning():
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(1, pcie=(1, 5, 16, 16)))))
    assert results["gpu.E007"].status == Status.WARN


def test_ecc_aggregate_only_warns():
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, ecc_unc_aggregate=2))))
    assert results["gpu.E004"].status == Status.WARN


def test_row_remap_failure_fails():
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(6, remap=(0, 0, 0, 1)))))
    assert results["gpu.E005"].status == Status.FAIL


@pytest.mark.parametrize(
    ("reasons", "status"),
    [
        (0x0, Status.PASS),
        (0x4, Status.PASS),
        (0x20, Status.WARN),
        (0x8, Status.FAIL),
        (0x40, Status.FAIL),
        (0x80, Status.FAIL),
    ],
)
def test_clock_event_reasons(reasons, status):
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(4, reasons=reasons))))
    assert results["gpu.E008"].status == status


@pytest.mark.parametrize(("temp", "status"), [(79, Status.PASS), (80, Status.WARN), (84, Status.FAIL)])
def test_temperature_band(temp, status):
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, temp=temp))))
    assert results["gpu.E009"].status == status
    assert results["gpu.E009"].value == max(temp, 41)


def test_persistence_off_warns():
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, persistence=0))))
    assert results["gpu.E010"].status == Status.WARN
    assert "gpunode_driver_persistence_enabled" in results["gpu.E010"].hint


def test_foreign_process_warns():
    results, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(2, procs=[4242]))))
    r = results["gpu.E012"]
    assert r.status == Status.WARN and "4242" in r.message


@pytest.mark.parametrize(
    ("xid", "status"), [(79, Status.FAIL), (48, Status.FAIL), (94, Status.WARN), (13, Status.PASS)]
)
def test_xid_events(xid, status):
    from hostcheck.gather.system import XidEvent

    ev = (XidEvent(pci="0000:2a:00", xid=xid, text="pid=1, something"),)
    results, _ = judge(S.make_snapshot(system=S.h100_system(xid_events=ev)))
    r = results["gpu.E011"]
    assert r.status == status and r.value == 1
    assert r.details[0].startswith("GPU 1 (0000:2a:00):")
    if status is not Status.PASS:
        assert f"Xid {xid} (" in r.message and "on GPU 1 (0000:2a:00)" in r.message
        assert r.brief == f"Xid {xid} on GPU 0000:2a:00"


def test_unreadable_kernel_log_skips_xid():
    sysm = S.h100_system(xid_events=Unavailable("no_permission", "dmesg: read kernel buffer failed"))
    results, _ = judge(S.make_snapshot(system=sysm))
    assert results["gpu.E011"].status == Status.SKIP


def test_driver_too_old_is_fail_with_driver_fix():
    results, _ = judge(S.SCENARIOS["driver_too_old"][0]())
    r = results["torch.E002"]
    assert r.status == Status.FAIL and r.value == "13.0"
    assert "gpunode_driver" in r.hint


def test_torch_cuda_minor_newer_than_driver_warns():
    snap = S.make_snapshot(probe=S.h100_probe(torch={"cuda": "12.8"}), nvml=S.FakeNvml(cuda=12040))
    results, _ = judge(snap)
    assert results["torch.E002"].status == Status.WARN


def test_cpu_only_torch_fails():
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(torch={"cuda": None, "cuda_available": False})))
    assert results["torch.E002"].status == Status.FAIL
    assert results["torch.E004"].status == Status.FAIL
    assert results["torch.E003"].status == Status.SKIP


def test_arch_only_as_ptx_warns():
    probe = S.h100_probe(torch={"arch_list": ["sm_70", "sm_80", "compute_80"]})
    results, _ = judge(S.make_snapshot(probe=probe))
    assert results["torch.E003"].status == Status.WARN


def test_torch_not_installed():
    probe = S.h100_probe()
    probe["torch"] = {"installed": False, "error": "No module named 'torch'"}
    results, _ = judge(S.make_snapshot(probe=probe))
    assert results["torch.E001"].status == Status.FAIL
    assert "gpunode_pytorch_index: cu130" in results["torch.E001"].hint
    for rid in ("torch.E002", "torch.E003", "torch.E004", "torch.E005", "torch.E006"):
        assert results[rid].status == Status.SKIP


def test_probe_timeout_is_error_not_traceback():
    snap = S.make_snapshot(torch_error=Unavailable("timeout", "probe did not finish in 90 s"))
    results, _ = judge(snap)
    assert results["torch.E001"].status == Status.ERROR
    assert results["tuning.E002"].status == Status.SKIP


def test_torch_version_differs_from_fact():
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(torch={"version": "2.9.1+cu128", "cuda": "12.8"})))
    assert results["torch.E006"].status == Status.FAIL


def test_tiny_shm_fails_and_names_role_variable():
    results, _ = judge(S.SCENARIOS["tiny_shm"][0]())
    r = results["tuning.E001"]
    assert r.status == Status.FAIL and r.value == 64 << 20 and r.expected == 64 << 30
    assert "gpunode_tuning_shm_size: 64G" in r.hint and "--tags shm" in r.hint


def test_tiny_shm_without_facts_fails_at_dockers_default():
    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}
    results, _ = judge(S.make_snapshot(tuning=S.h100_tuning(shm_bytes=64 << 20), facts=facts))
    assert results["tuning.E001"].status == Status.FAIL


@pytest.mark.parametrize("size", [(64 << 20) + 4096, 512 << 20, 1 << 30])
def test_shm_above_dockers_default_but_under_the_target_only_warns(size):
    # No public figure says 512 MiB is too small for a node: below the default target it warns, never fails.
    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}
    results, _ = judge(S.make_snapshot(tuning=S.h100_tuning(shm_bytes=size), facts=facts))
    assert results["tuning.E001"].status == Status.WARN


def test_no_allocator_without_facts_is_the_measured_default():
    # glibc is what the measurements support (tcmalloc 0.96x pipeline, jemalloc slower): not a finding.
    factory, _ = S.SCENARIOS["no_allocator"]
    snap = factory()
    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}
    results, _ = judge(dataclasses.replace(snap, facts=S.make_snapshot(facts=facts).facts))
    assert results["tuning.E002"].status == Status.PASS
    assert results["tuning.E002"].value == "glibc"


def test_preload_that_loads_nothing_fails_without_facts():
    # A preload that loads nothing is a broken path whatever the facts say (it used to warn).
    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}
    probe = S.h100_probe(
        env={"LD_PRELOAD": "/nope/libtcmalloc.so.4"}, maps={"jemalloc": [], "tcmalloc": []}, symbols={}
    )
    results, _ = judge(S.make_snapshot(probe=probe, facts=facts))
    r = results["tuning.E002"]
    assert r.status == Status.FAIL and "did not load" in r.message


def test_allocator_installed_but_not_preloaded():
    probe = S.h100_probe(env={"OMP_NUM_THREADS": "14"}, maps={"jemalloc": [], "tcmalloc": []}, symbols={})
    results, _ = judge(S.make_snapshot(probe=probe))
    r = results["tuning.E002"]
    assert r.status == Status.FAIL and "installed" in r.message and r.value == "glibc"


def test_jemalloc_default_settings_warns():
    jem = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    facts = S.h100_facts()
    facts["gpunode_tuning"]["allocator"] = "jemalloc"
    probe = S.h100_probe(
        env={"LD_PRELOAD": jem}, maps={"jemalloc": [jem], "tcmalloc": []}, symbols={"mallctl": True}
    )
    results, _ = judge(S.make_snapshot(probe=probe, facts=facts))
    assert results["tuning.E002"].status == Status.WARN


def test_pillow_simd_overwritten_by_pillow():
    pillow = {"pillow-simd": "9.5.0.post2", "Pillow": "11.3.0", "PIL": "11.3.0", "libjpeg_turbo": "3.1.0"}
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(pillow=pillow)))
    r = results["tuning.E003"]
    assert r.status == Status.FAIL and "--force-reinstall --no-deps pillow-simd" in r.hint


def _pillow_simd(features):
    return {"pillow-simd": "12.1.1.post0", "Pillow": None, "PIL": "12.1.1.post0", "features": features}


ALL_PIL = dict.fromkeys(("freetype2", "libtiff", "webp", "littlecms2", "jpg_2000"), True)


def test_pillow_simd_with_every_codec_passes():
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(pillow=_pillow_simd(ALL_PIL))))
    r = results["tuning.E003"]
    assert r.status == Status.PASS and "webp" in r.message


def test_pillow_simd_without_a_promised_codec_fails():
    # What a build without libwebp-dev / libtiff-dev gives: the role's fact promised them.
    have = {**ALL_PIL, "webp": False, "libtiff": False}
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(pillow=_pillow_simd(have))))
    r = results["tuning.E003"]
    assert r.status == Status.FAIL and "libtiff, webp" in r.message
    assert "--tags pillow_simd" in r.hint and "missing libtiff, webp" in r.value


def test_pillow_simd_built_by_hand_without_a_codec_warns():
    facts = S.h100_facts()
    facts["gpunode_tuning"] = {
        k: v for k, v in facts["gpunode_tuning"].items() if k != "pillow_simd_features"
    }
    results, _ = judge(
        S.make_snapshot(probe=S.h100_probe(pillow=_pillow_simd({**ALL_PIL, "freetype2": False})), facts=facts)
    )
    r = results["tuning.E003"]
    assert r.status == Status.WARN and "without freetype2" in r.message


def test_pillow_simd_only_promised_codecs_count():
    # RHEL-family default: freetype2 and libtiff only; no webp is not a failure there.
    facts = S.h100_facts()
    facts["gpunode_tuning"]["pillow_simd_features"] = ["freetype2", "libtiff"]
    have = {**ALL_PIL, "webp": False, "littlecms2": False, "jpg_2000": False}
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(pillow=_pillow_simd(have)), facts=facts))
    assert results["tuning.E003"].status == Status.PASS


def test_pillow_simd_without_feature_probe_passes():
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(pillow=_pillow_simd(None))))
    assert results["tuning.E003"].status == Status.PASS


def test_omp_oversubscribed_values():
    results, _ = judge(S.SCENARIOS["omp_oversubscribed"][0]())
    r = results["tuning.E005"]
    assert r.status == Status.FAIL and r.value == 28
    assert "gpunode_tuning_omp_num_threads: 14" in r.hint


def test_omp_unset_on_multi_gpu_warns():
    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}
    probe = S.h100_probe(env={"LD_PRELOAD": S.TCMALLOC})
    results, _ = judge(S.make_snapshot(probe=probe, facts=facts))
    assert results["tuning.E005"].status == Status.WARN


def test_omp_differs_from_fact_fails():
    results, _ = judge(
        S.make_snapshot(probe=S.h100_probe(env={"LD_PRELOAD": S.TCMALLOC, "OMP_NUM_THREADS": "8"}))
    )
    assert results["tuning.E005"].status == Status.FAIL


def test_services_back_on_fails_when_role_disabled_them():
    from hostcheck.gather.tuning import ServiceState

    tuning = S.h100_tuning(services=(ServiceState("packagekit", "enabled", "active"),))
    results, _ = judge(S.make_snapshot(tuning=tuning))
    assert results["tuning.E006"].status == Status.FAIL


def test_governor_thp_limits_intent_vs_reality():
    tuning = S.h100_tuning(
        governors={"powersave": 224}, thp="never", rlimits={"memlock": (65536, 65536), "nofile": (1024, 4096)}
    )
    probe = S.h100_probe(rlimits={"memlock": [65536, 65536], "nofile": [1024, 4096]})
    results, _ = judge(S.make_snapshot(tuning=tuning, probe=probe))
    assert results["tuning.E007"].status == Status.FAIL
    assert results["tuning.E008"].status == Status.FAIL
    assert results["tuning.E009"].status == Status.FAIL and results["tuning.E009"].value == 65536
    assert results["tuning.E010"].status == Status.FAIL and results["tuning.E010"].expected == ">= 1048576"
    facts = S.h100_facts()
    del facts["gpunode_tuning"]["limits"]
    results, _ = judge(S.make_snapshot(tuning=tuning, probe=probe, facts=facts))
    assert results["tuning.E009"].status == Status.WARN and results["tuning.E010"].status == Status.WARN


def _limits_judged(container, **fact):
    tuning = S.h100_tuning(
        shm_bytes=64 << 20, rlimits={"memlock": (8 << 20, 8 << 20), "nofile": (1024, 4096)}
    )
    probe = S.h100_probe(rlimits={"memlock": [8 << 20, 8 << 20], "nofile": [1024, 4096]})
    facts = S.h100_facts()
    facts["gpunode_tuning"].update(fact)
    results, _ = judge(
        S.make_snapshot(tuning=tuning, probe=probe, facts=facts, system=S.h100_system(container=container))
    )
    return results["tuning.E001"].hint, results["tuning.E009"].hint, results["tuning.E010"].hint


def test_in_a_container_a_fix_the_role_already_has_is_the_runtimes_setting():
    """Docker's 64 MB /dev/shm and 8 MiB memlock inside a container, the role's variables at their defaults: the
    fix is the runtime's flag (docker run --shm-size / --ipc=host / --ulimit, NVIDIA's Containers User Guide;
    Kubernetes' emptyDir with medium Memory), never "set gpunode_tuning_limits_memlock: unlimited", which the role
    already has. On a host (the fault absent) the role's variable stays the fix."""
    shm, memlock, nofile = _limits_judged("docker", shm_size_target="50%")
    assert "--shm-size=64g" in shm and "--ipc=host" in shm and "sizeLimit: 64Gi" in shm
    assert "--ulimit memlock=-1" in memlock and "--ulimit nofile=1048576:1048576" in nofile
    assert not any("gpunode_tuning_" in h and "(role gpunode_tuning)" in h for h in (shm, memlock, nofile))
    shm, memlock, nofile = _limits_judged(None, shm_size_target="50%")
    assert "gpunode_tuning_shm_size: 64G (role gpunode_tuning)" in shm and "--shm-size" not in shm
    assert memlock == fixes.MEMLOCK and nofile == fixes.NOFILE


def test_in_a_container_a_value_the_site_chose_stays_the_roles_fix_unless_the_role_could_not_set_it():
    # The site set its own values: the role's variable is the fix, with the runtime's flag beside it for /dev/shm.
    shm, memlock, nofile = _limits_judged(
        "podman", shm_size_target="64G", limits={"memlock": "65536", "nofile": 65536}
    )
    assert (
        "gpunode_tuning_shm_size: 64G (role gpunode_tuning)" in shm
        and "in a container: --shm-size=64g" in shm
    )
    assert memlock == fixes.MEMLOCK and nofile == fixes.NOFILE
    # The role recorded it could not: PID 1's hard limits, no CAP_SYS_ADMIN to remount /dev/shm.
    skipped = {"limits": "container: PID 1 hard limits ...", "shm_remount": "container without CAP_SYS_ADMIN"}
    shm, memlock, nofile = _limits_judged(
        "podman", shm_size_target="64G", limits={"memlock": "65536", "nofile": 65536}, skipped=skipped
    )
    assert shm.startswith("the container runtime sizes /dev/shm") and memlock == fixes.RUNTIME_MEMLOCK
    assert nofile == fixes.RUNTIME_NOFILE


def test_the_tuning_defaults_the_fixes_know_are_the_roles():
    import yaml

    defaults = yaml.safe_load((ROOT / "roles" / "gpunode_tuning" / "defaults" / "main.yml").read_text())
    assert {k: defaults["gpunode_tuning_" + k] for k in fixes.TUNING_DEFAULTS} == fixes.TUNING_DEFAULTS


def test_fact_values_as_strings_are_understood():
    facts = S.h100_facts()
    facts["gpunode_tuning"].update(
        omp_num_threads="14", shm_size_bytes=str(64 << 30), numa_nodes="2", pillow_simd="True"
    )
    results, verdict = judge(S.make_snapshot(facts=facts))
    assert verdict.ready and verdict.score == 100
    facts["gpunode_tuning"]["omp_num_threads"] = 0  # "auto" in the role: no intent to compare
    results, _ = judge(S.make_snapshot(facts=facts))
    assert results["tuning.E005"].status == Status.PASS


def test_numa_placement_differs_from_fact():
    facts = S.h100_facts()
    facts["gpunode_tuning"]["gpu_numa"]["0000:18:00.0"] = 1
    results, _ = judge(S.make_snapshot(facts=facts))
    assert results["tuning.E004"].status == Status.FAIL


def test_missing_env_file_recorded_by_role_fails():
    tuning = S.h100_tuning(env=Unavailable(NOT_FOUND, "/etc/gpunode/training.env does not exist"))
    results, _ = judge(S.make_snapshot(tuning=tuning))
    assert results["tuning.E011"].status == Status.FAIL


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_thread_count_below_one_is_not_ready(value):
    """OMP_NUM_THREADS=0 and -1 once passed as ready."""
    probe = S.h100_probe(env={"LD_PRELOAD": S.TCMALLOC, "OMP_NUM_THREADS": value})
    results, _ = judge(S.make_snapshot(probe=probe))
    r = results["tuning.E005"]
    assert r.status == Status.FAIL and "not a thread count" in r.message


def test_env_file_problems_fail_e011_and_the_bad_lines_are_left_out():
    from hostcheck.gather.tuning import env_file_entries

    text = (
        "# gpunode\nOMP_NUM_THREADS=14\nBAD\0=1\nMALLOC_CONF=a\0b\n1X=2\nexport KMP_BLOCKTIME=0\njust words\n"
    )
    env, problems = env_file_entries(text)
    assert env == {"OMP_NUM_THREADS": "14", "KMP_BLOCKTIME": "0"}
    assert problems == [
        "line 3: a NUL byte",
        "line 4: a NUL byte",
        "line 5: '1X' is not a variable name",
        "line 7: not KEY=value",
    ]
    tuning = S.h100_tuning(env=env, env_problems=tuple(problems))
    results, _ = judge(S.make_snapshot(tuning=tuning))
    r = results["tuning.E011"]
    assert r.status == Status.FAIL and "line 3: a NUL byte" in r.message


def test_no_nvml_python_module_with_driver_is_error():
    def loader():
        raise ImportError("No module named 'pynvml'")

    snap = dataclasses.replace(S.make_snapshot(), nvml=gather_nvml(loader=loader, fallback=None))
    results, verdict = judge(snap)
    assert results["gpu.E001"].status == Status.ERROR
    assert "nvidia-ml-py" in results["gpu.E001"].hint
    assert results["gpu.E004"].status == Status.SKIP
    assert not verdict.ready


def test_driver_library_mismatch():
    snap = S.make_snapshot(nvml=S.FakeNvml(init_error=S.MISMATCH))
    results, _ = judge(snap)
    assert results["gpu.E001"].status == Status.FAIL and "reboot" in results["gpu.E001"].hint


def test_kmod_and_nvml_versions_differ():
    results, _ = judge(S.make_snapshot(system=S.h100_system(driver_version="580.95.05")))
    assert results["gpu.E001"].status == Status.FAIL


@pytest.mark.parametrize("code", [S.NOT_SUPPORTED, S.UNKNOWN, S.GPU_IS_LOST, S.NO_PERMISSION])
@pytest.mark.parametrize("function", S.NVML_DEVICE_FUNCTIONS)
def test_any_nvml_call_failing_gives_results_not_tracebacks(function, code):
    snap = S.make_snapshot(nvml=S.FakeNvml(fail={function: code}))
    results, verdict = judge(snap)
    assert len(results) == len([c for c in all_checks() if c.category != "workload"])
    for r in results.values():
        assert "raised" not in r.message, r  # no check crashed
    if function == "nvmlDeviceGetHandleByIndex":
        assert results["gpu.E002"].status == Status.FAIL  # every GPU unreachable
    if code == S.GPU_IS_LOST:
        assert results["gpu.E002"].status == Status.FAIL and not verdict.ready
    if code == S.NOT_SUPPORTED and function != "nvmlDeviceGetHandleByIndex":  # unsupported fields skip
        assert verdict.ready


def test_one_gpu_lost_mid_run():
    snap = S.make_snapshot(nvml=S.FakeNvml(fail={"nvmlDeviceGetHandleByIndex@5": S.GPU_IS_LOST}))
    results, _ = judge(snap)
    assert results["gpu.E002"].status == Status.FAIL and results["gpu.E002"].value == 7
    assert "GPU 5" in results["gpu.E002"].message and "nvidia-smi -r -i 5" in results["gpu.E002"].hint
    # Said once, by gpu.E002: the other checks judge the seven GPUs left and say GPU 5 was not judged.
    assert results["gpu.E004"].status == Status.PASS
    assert any("GPU 5: not judged, the GPU is lost" in d for d in results["gpu.E004"].details)
    assert results["gpu.E009"].status == Status.PASS and not results["gpu.E009"].hint


def test_nvml_shutdown_called(scenarios):
    nv = S.FakeNvml()
    gather_nvml(nvml=nv, proc_name=str)
    assert nv.shutdown_called


@pytest.mark.parametrize(
    ("fact_version", "status"), [("580.95.05", Status.WARN), ("570.195.03", Status.FAIL)]
)
def test_driver_changed_since_provisioning(fact_version, status):
    facts = S.h100_facts()
    facts["gpunode_driver"]["version"] = fact_version
    results, _ = judge(S.make_snapshot(facts=facts))
    assert results["gpu.E001"].status == status and results["gpu.E001"].expected == fact_version


def test_malloc_conf_differs_from_fact():
    facts = S.h100_facts()
    facts["gpunode_tuning"]["malloc_conf"] = "dirty_decay_ms:-1"
    results, _ = judge(S.make_snapshot(facts=facts))
    assert results["tuning.E002"].status == Status.FAIL


def test_numa_node_count_differs_from_fact():
    facts = S.h100_facts()
    facts["gpunode_tuning"]["numa_nodes"] = 4
    results, _ = judge(S.make_snapshot(facts=facts))
    assert results["tuning.E004"].status == Status.FAIL


def test_local_facts_check():
    results, _ = judge(S.make_snapshot())
    assert results["system.E004"].status == Status.PASS
    results, _ = judge(S.make_snapshot(facts={}))
    assert results["system.E004"].status == Status.WARN
    snap = S.make_snapshot()
    facts = dataclasses.replace(snap.facts, errors={"gpunode_tuning": Unavailable("error", "not JSON")})
    results, _ = judge(dataclasses.replace(snap, facts=facts))
    assert results["system.E004"].status == Status.WARN


def test_numa_minus_one_in_fact_is_not_a_mismatch():
    facts = S.h100_facts()
    facts["gpunode_tuning"]["gpu_numa"] = {f"0000:{b}:00.0": -1 for b in S.H100_BUSES}
    results, _ = judge(S.make_snapshot(facts=facts))
    assert results["tuning.E004"].status == Status.PASS


def test_no_permission_skips_rather_than_blocks():
    snap = S.make_snapshot(nvml=S.FakeNvml(fail={"nvmlDeviceGetComputeRunningProcesses": S.NO_PERMISSION}))
    results, verdict = judge(snap)
    assert results["gpu.E012"].status == Status.SKIP and "root" in results["gpu.E012"].message
    assert verdict.ready


def test_kmp_variables_with_libgomp_warn():
    env = {"LD_PRELOAD": S.TCMALLOC, "OMP_NUM_THREADS": "14", "KMP_AFFINITY": "granularity=fine,compact"}
    results, _ = judge(S.make_snapshot(probe=S.h100_probe(env=env)))
    assert results["tuning.E005"].status == Status.WARN


# NVSwitch fabric (gpu.E013): the healthy scenario is an HGX board with four NVSwitches.
def test_hgx_fabric_healthy_passes():
    r, _ = judge(S.make_snapshot())
    assert r["gpu.E013"].status == Status.PASS
    assert "4 NVSwitch" in r["gpu.E013"].message and r["gpu.E013"].value == "580.159.04"


def test_fabricmanager_down_names_service_and_probe():
    r, verdict = judge(S.SCENARIOS["fabricmanager_down"][0]())
    assert r["gpu.E013"].status == Status.FAIL and not verdict.ready
    assert "nvidia-fabricmanager is failed" in r["gpu.E013"].message
    assert "in progress on GPU 0,1,2,3,4,5,6,7" in r["gpu.E013"].message
    assert "gpunode_driver_fabricmanager" in r["gpu.E013"].hint


def test_fabricmanager_version_mismatch_hint_is_the_version_pin():
    r, _ = judge(S.SCENARIOS["fabricmanager_version_mismatch"][0]())
    assert "580.95.05 but driver 580.159.04" in r["gpu.E013"].message
    assert "gpunode_driver_version" in r["gpu.E013"].hint


def test_fabricmanager_not_installed_on_nvswitch_board_fails():
    snap = S.make_snapshot(system=S.h100_system(fabric=S.hgx_fabric(fm_version=None, fm_active="inactive")))
    r, _ = judge(snap)
    assert r["gpu.E013"].status == Status.FAIL and "not installed" in r["gpu.E013"].message


def test_fabric_registration_error_fails():
    snap = S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(6, fabric=(3, 999))))
    r, _ = judge(snap)
    assert r["gpu.E013"].status == Status.FAIL and "GPU 6" in r["gpu.E013"].message


def test_pcie_node_without_nvswitch_skips():
    facts = S.h100_facts()
    del facts["gpunode_driver"]["fabricmanager"]
    snap = S.make_snapshot(
        nvml=S.FakeNvml(gpus=[S.h100_gpu(i, fabric=(0, 3)) for i in range(8)]),
        system=S.h100_system(fabric=S.FabricState()),
        facts=facts,
    )
    r, verdict = judge(snap)
    assert r["gpu.E013"].status == Status.SKIP and "Fabric Manager not needed" in r["gpu.E013"].message
    assert verdict.ready


def test_fabric_pending_without_visible_nvswitch_warns():
    facts = S.h100_facts()
    facts["gpunode_driver"]["fabricmanager"] = False
    snap = S.make_snapshot(
        nvml=S.FakeNvml(gpus=S.gpus_with(0, fabric=(1, 0))),
        system=S.h100_system(fabric=S.FabricState()),
        facts=facts,
    )
    r, _ = judge(snap)
    assert r["gpu.E013"].status == Status.WARN and "GPU 0" in r["gpu.E013"].message


def test_fact_promises_fabricmanager_that_is_gone():
    # The role installed it (fact), the switches are not visible (e.g. a sysfs read failed): still judged.
    snap = S.make_snapshot(system=S.h100_system(fabric=S.FabricState(fm_version=None)))
    r, _ = judge(snap)
    assert r["gpu.E013"].status == Status.FAIL and "fabricmanager: true" in r["gpu.E013"].message


def test_fabric_in_container_leaves_fabricmanager_to_the_host():
    snap = S.make_snapshot(system=S.h100_system(container="docker", fabric=S.hgx_fabric(fm_version=None)))
    r, _ = judge(snap)
    assert r["gpu.E013"].status == Status.PASS and "runs on the host" in r["gpu.E013"].message


# --- fix hints read the platform data (hostcheck/data/platform.json), as the roles do -------------------------------


def test_a_debian12_node_without_a_driver_is_told_what_its_distro_gives():
    # The old hint said gpunode_driver_branch: 580 and cu130 everywhere; Debian 12's distro source ships 535.
    snap = S.make_snapshot(
        nvml=S.FakeNvml(init_error=S.LIBRARY_NOT_FOUND),
        system=S.h100_system(driver_version=S._no_driver(), os_id="debian", os_version="12"),
        probe=S.h100_probe(torch={"cuda": None, "version": "2.13.0+cpu"}),
    )
    r, _ = judge(snap)
    assert "Debian 12's own 535 driver" in r["gpu.E001"].hint
    assert (
        "gpunode_driver_branch: 580" in r["gpu.E001"].hint
    )  # the way to the newer branch, via NVIDIA's repo
    assert "gpunode_pytorch_index: cu126" in r["torch.E002"].hint


def test_a_volta_node_is_pointed_at_the_build_that_still_has_sm70():
    snap = S.make_snapshot(
        nvml=S.FakeNvml(gpus=[S.h100_gpu(i, cc=(7, 0)) for i in range(8)]),
        probe=S.h100_probe(torch={"arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]}),
    )
    r, _ = judge(snap)
    assert r["torch.E003"].status is Status.FAIL
    assert "gpunode_pytorch_index: cu126" in r["torch.E003"].hint


# Driver branch lifecycle (gpu.E014): NVIDIA's end of life per branch, from the platform data.
def _on_driver(version):
    return S.make_snapshot(
        nvml=S.FakeNvml(driver=version),
        system=S.h100_system(driver_version=version, fabric=S.hgx_fabric(fm_version=version)),
        facts=S._facts_with("gpunode_driver", branch=version.split(".")[0], version=version),
    )


def test_a_node_on_an_ended_driver_branch_warns_with_the_branch_to_move_to():
    # Fault planted: branch 550, which NVIDIA lists as end of life.
    results, _ = judge(_on_driver("550.163.01"))
    r = results["gpu.E014"]
    assert r.status == Status.WARN and "end of life" in r.message and r.value == "550.163.01"
    assert r.expected == "branch 580" and "gpunode_driver_branch: 580" in r.hint
    assert "--tags driver" in r.hint


def test_a_node_on_a_supported_driver_branch_passes(healthy):
    # Fault absent: the healthy node runs 580 (long-term support to June 2028).
    results, _ = judge(healthy)
    r = results["gpu.E014"]
    assert r.status == Status.PASS and "580" in r.message and "June 2028" in r.message


def test_a_new_feature_branch_warns_and_an_unknown_branch_is_not_judged():
    results, _ = judge(_on_driver("590.48.01"))
    assert results["gpu.E014"].status == Status.WARN and "new feature" in results["gpu.E014"].message
    results, _ = judge(_on_driver("600.10.01"))
    assert (
        results["gpu.E014"].status == Status.SKIP
        and "not in the platform data" in results["gpu.E014"].message
    )


def test_the_branch_check_without_nvml_says_so():
    results, _ = judge(S.SCENARIOS["no_nvml"][0]())
    assert results["gpu.E014"].status == Status.SKIP and "NVML unavailable" in results["gpu.E014"].message


@pytest.mark.parametrize(
    "os_id, version, pretty, status, needle",
    [
        # The roles' table (hostcheck/data/platform.json): Debian 11 left LTS on 2026-08-31 (wiki.debian.org/LTS),
        # CentOS Stream 8 ended on 2024-05-31; both passed while gpunode_base refused them.
        ("debian", "11", "Debian GNU/Linux 11 (bullseye)", Status.WARN, "the gpunode roles refuse Debian 11"),
        ("centos", "8", "CentOS Stream 8", Status.WARN, "the gpunode roles refuse CentOS 8"),
        ("ubuntu", "26.04", "Ubuntu 26.04 LTS", Status.WARN, "the gpunode roles refuse Ubuntu 26"),
        ("opensuse-leap", "15.6", "openSUSE Leap 15.6", Status.WARN, "not a distribution the gpunode roles"),
        # The fault absent: what the roles provision passes.
        ("debian", "12", "Debian GNU/Linux 12 (bookworm)", Status.PASS, "Debian GNU/Linux 12"),
        ("ubuntu", "22.04", "Ubuntu 22.04.5 LTS", Status.PASS, "Ubuntu 22.04.5"),
        ("rhel", "9.4", "Red Hat Enterprise Linux 9.4 (Plow)", Status.PASS, "Red Hat"),
        ("centos", "9", "CentOS Stream 9", Status.PASS, "CentOS Stream 9"),
    ],
)
def test_os_supported_is_the_roles_table(os_id, version, pretty, status, needle):
    from hostcheck import platform

    system = S.h100_system(os_id=os_id, os_version=version, os_pretty=pretty)
    r = judge(S.make_snapshot(system=system))[0]["system.E001"]
    assert r.status == status and needle in r.message, r
    key, row = platform.os_row_for(platform.load(), os_id, version)
    if row:  # gpunode_base's plan reads the same row: refused where this warns, with the same reason
        family = row["family"]
        plan = platform.node_plan(
            os={"distribution": key.split(" ")[0], "major": key.split(" ")[1], "family": family}
        )
        assert plan["os"]["supported"] == (status == Status.PASS), plan
    if status == Status.WARN and row:
        assert row["why"] in r.message and r.brief and any(row["why"][:40] in e for e in plan["errors"])
