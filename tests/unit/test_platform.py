"""The platform data (hostcheck/data/platform.json) and the one decision per node (hostcheck/platform.py).

Scenario style: a node (OS, GPUs by PCI id, driver and torch settings) -> the plan the roles follow. Each
defect the platform-truth work fixed has a scenario here that the old per-role logic got wrong; the comment
above it says what the old code did.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from hostcheck import platform as pf

ROOT = Path(__file__).resolve().parents[2]
DATA = pf.load()

H100 = "0x2330"  # H100 SXM5 80GB
V100 = "0x1db1"  # V100 SXM2 16GB
B200 = "0x2901"  # B200
T4 = "0x1eb8"  # Tesla T4

DEBIAN12 = {"distribution": "Debian", "major": "12", "family": "Debian"}
DEBIAN13 = {"distribution": "Debian", "major": "13", "family": "Debian"}
UBUNTU24 = {"distribution": "Ubuntu", "major": "24", "family": "Debian"}
ROCKY8 = {"distribution": "Rocky", "major": "8", "family": "RedHat"}
ROCKY9 = {"distribution": "Rocky", "major": "9", "family": "RedHat"}


def plan(os=ROCKY9, gpus=(H100,), driver=None, torch=None, cuda=None, **kw):
    return pf.node_plan(
        os=os,
        gpus=list(gpus),
        driver=driver or {},
        torch={"version": "2.13.0", **(torch or {})},
        cuda={"source": "pip", **(cuda or {})},
        **kw,
    )


def ok(p):
    assert p["ok"], p["errors"]
    return p


def refused(p, *needles):
    assert not p["ok"], p
    text = " ".join(p["errors"])
    for needle in needles:
        assert needle in text, (needle, p["errors"])
    return text


# --- the data itself -----------------------------------------------------------------------------------


def _rows():
    yield from (("torch " + k, v) for k, v in DATA["torch"].items())
    yield from (("CUDA " + k, v) for k, v in DATA["cuda"].items())
    yield from (("CUDA major " + k, v) for k, v in DATA["cuda_major"].items())
    yield from (("GPU " + k, v) for k, v in DATA["gpus"].items())
    yield from (("arch " + k, v) for k, v in DATA["archs"].items())
    yield from (("OS " + k, v) for k, v in DATA["os"].items())


@pytest.mark.parametrize(("name", "row"), list(_rows()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_row_carries_its_source(name, row):
    source = row.get("source")
    assert source, f"{name} has no source"
    texts = list(source.values()) if isinstance(source, dict) else [source]
    for text in texts:
        assert isinstance(text, str) and len(text) > 20, f"{name}: a source names a document, not {text!r}"


def test_every_variant_names_a_cuda_the_data_knows():
    for minor, row in DATA["torch"].items():
        assert row["variants"], minor
        assert sum(v["role"] == "stable" for v in row["variants"].values()) >= 1, minor
        for tag, variant in row["variants"].items():
            cuda = pf.cuda_normalize(tag)
            assert cuda in DATA["cuda"], (minor, tag)
            assert cuda.split(".")[0] in DATA["cuda_major"], (minor, tag)
            assert variant["role"] in ("stable", "legacy", "experimental", "extra"), (minor, tag)
            assert all(re.fullmatch(r"\d+\.\d+", s) for s in variant["sm"]), (minor, tag)


def test_every_gpu_names_a_known_arch():
    for pci, row in DATA["gpus"].items():
        assert re.fullmatch(r"0x[0-9a-f]{4}", pci)
        assert row["arch"] in DATA["archs"], pci
        assert row["sm"] in DATA["archs"][row["arch"]]["sm"], pci


def test_supported_os_list_is_honest():
    supported = set(pf.supported_os(DATA))
    assert supported == {
        "Debian 12",
        "Debian 13",
        "Ubuntu 22",
        "Ubuntu 24",
        "Rocky 8",
        "Rocky 9",
        "AlmaLinux 8",
        "AlmaLinux 9",
        "RedHat 8",
        "RedHat 9",
        "CentOS 9",
    }
    for name in ("Debian 11", "CentOS 8", "Ubuntu 26"):
        assert DATA["os"][name]["why"], name


# --- defect 1: torch rows -------------------------------------------------------------------------------


def test_torch_213_ships_no_cu128():
    # Old table: 2.12/2.13 listed 12.6/12.8/13.0, so auto on a driver below 580 chose cu128 and pip found nothing.
    for minor in ("2.12", "2.13"):
        assert "cu128" not in DATA["torch"][minor]["variants"]
    assert "cu129" not in DATA["torch"]["2.12"]["variants"]
    # 2.13's Linux-only cu129 build has no published architecture list: auto never picks it.
    assert DATA["torch"]["2.13"]["variants"]["cu129"]["role"] == "extra"
    p = ok(plan(driver={"branch": "570"}))
    assert p["torch"]["tag"] == "cu126"


def test_auto_prefers_the_releases_default_build():
    # 2.14 ships cu130 and cu132 as stable; PyPI's default is cu130.
    assert ok(plan(torch={"version": "2.14.0"}, driver={"branch": "580"}))["torch"]["tag"] == "cu130"
    assert (
        ok(plan(torch={"version": "2.14.0", "cuda": "cu132"}, driver={"branch": "580"}))["torch"]["tag"]
        == "cu132"
    )


def test_a_planned_release_is_a_warning():
    p = ok(plan(torch={"version": "2.15.0", "cuda": "cu130"}, driver={"branch": "580"}))
    assert "planned" in p["warnings"][0]


def test_torch_213_cu128_is_refused_with_the_builds_it_has():
    text = refused(plan(torch={"cuda": "cu128"}), "torch 2.13.0 has no cu128 build")
    assert "cu126" in text and "cu130" in text


def test_rows_for_214_and_215_exist_and_215_drops_cu126():
    assert {"2.14", "2.15"} <= set(DATA["torch"])
    assert "cu126" in DATA["torch"]["2.14"]["variants"]
    assert "cu126" not in DATA["torch"]["2.15"]["variants"]


def test_v100_on_215_is_refused_with_the_nearest_release():
    # Old table had no 2.15 row at all; with one, Volta (sm_70) has no build left.
    text = refused(plan(gpus=[V100], torch={"version": "2.15.0"}), "sm_70")
    assert "nearest working choice torch 2.14" in text and "cu126" in text


def test_torchaudio_no_longer_tracks_torch():
    # Old code paired torchaudio 2.M.P with torch 2.M.P: torchaudio 2.13.0 does not exist.
    p = ok(plan(torch={"version": "2.13.0"}))
    assert p["torch"]["torchaudio"] and not p["torch"]["torchaudio"].startswith("2.13")
    assert p["torch"]["torchvision"].startswith("0.28")


# --- defect 2: the training Python ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("os", "python"), [(ROCKY8, "python3.11"), (ROCKY9, "python3.11"), (DEBIAN12, "python3.11")]
)
def test_training_python_is_new_enough(os, python):
    # Old roles created the venv with the OS python3: 3.6 on EL8, 3.9 on EL9 (torch >= 2.9 needs >= 3.10).
    p = ok(plan(os=os, driver={"source": "nvidia"} if os is DEBIAN12 else None))
    assert p["python"]["name"] == python and p["python"]["packages"]


def test_an_old_python_is_refused():
    refused(plan(torch={"python": "python3.9"}), "supports Python 3.10", "3.9")
    refused(plan(torch={"python": "/usr/bin/python3", "python_version": "3.6"}), "3.6")


# --- defect 3: CUDA major follows torch --------------------------------------------------------------------


def test_cudnn_and_nccl_follow_torchs_cuda_major():
    # Old code: gpunode_cuda_version defaulted to 12.8 whatever torch chose, so a 580 driver gave torch cu130 beside
    # cu12 cuDNN/NCCL wheels (two libraries in nvidia/cudnn/lib).
    p = ok(plan(driver={"branch": "580"}))
    assert p["torch"]["tag"] == "cu130"
    assert p["cuda"]["major"] == "13" and p["cuda"]["wheel_suffix"] == "cu13"
    assert p["cuda"]["cudnn"] == DATA["torch"]["2.13"]["libraries"]["cu13"]["cudnn"]
    assert p["cuda"]["nccl"] == DATA["torch"]["2.13"]["libraries"]["cu13"]["nccl"]


def test_a_cuda_version_of_another_major_is_refused():
    refused(
        plan(driver={"branch": "580"}, cuda={"version": "12.8"}),
        "cuDNN and NCCL must match torch's CUDA major",
    )


@pytest.mark.parametrize("version", ["abc", "thirteen", "13"])
def test_a_malformed_cuda_version_is_a_plan_error_not_an_exception(version):
    refused(plan(cuda={"version": version}), "gpunode_cuda_version", "not a CUDA version")


def test_distro_toolkit_must_share_torchs_major():
    # Debian 12's archive toolkit is 11.8; the old fact recorded the requested version instead.
    refused(
        plan(os=DEBIAN12, gpus=[H100], cuda={"source": "distro"}),
        "ships CUDA toolkit 11.8",
        "gpunode_cuda_source: pip",
    )


# --- defect 6: kernel-module flavour and GPU architectures --------------------------------------------------


def test_blackwell_gets_open_modules_and_volta_proprietary():
    assert ok(plan(gpus=[B200]))["driver"]["flavour"] == "open"
    assert ok(plan(gpus=[V100], torch={"cuda": "cu126"}))["driver"]["flavour"] == "proprietary"
    # Hopper follows NVIDIA's default for the branch.
    assert ok(plan(gpus=[H100], driver={"branch": "580"}))["driver"]["flavour"] == "open"


def test_blackwell_with_proprietary_modules_is_refused():
    refused(plan(gpus=[B200], driver={"open": "false"}), "works only with NVIDIA's open kernel modules")


def test_volta_with_open_modules_is_refused():
    refused(plan(gpus=[V100], driver={"open": "true"}), "not supported by NVIDIA's open kernel modules")


def test_auto_on_a_v100_never_picks_cuda_13():
    # Old auto chose cu130 on a V100 with a 580 driver: CUDA 13 has no sm_70 kernels.
    p = ok(plan(gpus=[V100], driver={"branch": "580"}))
    assert p["torch"]["tag"] == "cu126"


def test_debian12_distro_has_no_open_modules_at_the_drivers_version():
    refused(plan(os=DEBIAN12, gpus=[T4], driver={"open": "true"}), "no open kernel modules")


def test_a_branch_too_old_for_the_gpu_is_refused():
    text = refused(plan(os=DEBIAN12, gpus=[B200]), "needs driver branch >=")
    assert "gpunode_driver_source: nvidia" in text


def test_debian_distro_branch_is_the_only_one_it_ships():
    refused(plan(os=DEBIAN12, gpus=[H100], driver={"branch": "580"}), "ships only the 535 driver branch")
    ok(plan(os=DEBIAN12, gpus=[H100], driver={"branch": "580", "source": "nvidia"}))


# --- refusals and their nearest working choice ----------------------------------------------------------


def test_unknown_torch_names_the_override():
    refused(plan(torch={"version": "2.99.0"}), "gpunode_platform_overrides")
    row = {"2.99": {**DATA["torch"]["2.13"], "source": "a test row"}}
    ok(plan(torch={"version": "2.99.0"}, overrides={"torch": row}))


def test_no_gpu_and_auto_is_refused_cpu_is_fine():
    refused(plan(gpus=[]), "gpunode_pytorch_cuda: cpu")
    p = ok(plan(gpus=[], torch={"cuda": "cpu"}, cuda={"enabled": False}))
    assert p["torch"]["tag"] == "cpu" and p["cuda"]["version"] == ""


def test_old_driver_for_every_build():
    text = refused(plan(driver={"branch": "470"}), "no CUDA build of torch 2.13.0 serves this node")
    assert "needs driver >=" in text


def test_ubuntu_2604_is_refused_with_the_reason():
    row = DATA["os"]["Ubuntu 26"]
    assert row["supported"] is False and "not been checked" in row["why"]
    text = refused(
        plan(os={"distribution": "Ubuntu", "major": "26", "family": "Debian"}), "Ubuntu 26 is not supported"
    )
    assert "gpunode_base_enforce_supported_os: false" in text


def test_unsupported_os_says_why_and_can_be_overridden():
    refused(plan(os={"distribution": "CentOS", "major": "8", "family": "RedHat"}), "2024-05-31")
    refused(plan(os={"distribution": "Debian", "major": "11", "family": "Debian"}), "2026-08-31")
    p = ok(plan(os={"distribution": "OracleLinux", "major": "9", "family": "RedHat"}, enforce_os=False))
    assert "trying anyway" in p["warnings"][0]


def test_an_unknown_gpu_is_a_warning_not_a_guess():
    p = ok(plan(gpus=["0xffff"]))
    assert "0xffff" in p["warnings"][0]


@pytest.mark.parametrize(
    "bad",
    [
        {"torch": {"version": "latest"}},
        {"torch": {"cuda": "twelve"}},
        {"torch": {"policy": "loose"}},
        {"driver": {"open": "maybe"}},
        {"overrides": ["not", "a", "mapping"]},
    ],
)
def test_bad_inputs_become_errors_not_exceptions(bad):
    assert not plan(**bad)["ok"]


# --- hostcheck reads the same data ---------------------------------------------------------------------


def test_hint_for_a_cpu_only_debian12_node_is_what_its_distro_can_give():
    # Old hint: gpunode_driver_branch 580 and cu130, which Debian 12's distro driver (535) cannot run.
    from hostcheck import fixes

    driver, source = pf.default_branch(DATA, pf.os_row_for(DATA, "debian", "12")[1])
    assert (driver, source) == ("535", "distro")
    assert pf.index_for(DATA, driver) == "cu126"
    assert "Debian 12's own 535 driver" in fixes.driver_install("debian", "12")
    assert "gpunode_driver_branch: 580" in fixes.driver_install("rocky", "9.4")


def test_index_for_a_volta_and_a_new_driver():
    assert pf.index_for(DATA, "580.95.05", ["7.0"]) == "cu126"
    assert pf.index_for(DATA, "580.95.05", ["9.0"]) == "cu130"


def test_the_roles_filter_is_this_module():
    path = ROOT / "plugins" / "filter" / "gpunode_platform.py"
    spec = importlib.util.spec_from_file_location("gpunode_platform_filter", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    filters = mod.FilterModule().filters()
    inputs = {"os": ROCKY9, "gpus": [H100], "torch": {"version": "2.13.0"}, "cuda": {"source": "pip"}}
    assert filters["gpunode_node_plan"](inputs) == pf.node_plan(**inputs)


# --- version order (PEP 440) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("2.11.0rc1", "2.11.0"),
        ("2.11.0", "2.11.0.post1"),
        ("2.11.0.dev1", "2.11.0a1"),
        ("2.11.0a1", "2.11.0b1"),
        ("2.11.0b1", "2.11.0rc1"),
        ("2.11.0rc1", "2.11.0rc2"),
        ("2.10.9", "2.11.0.dev0"),
        ("2.11.0a1.dev1", "2.11.0a1"),
        ("2.11.0.post1.dev1", "2.11.0.post1"),
        ("580.65.06", "580.95.05"),
        ("575.57.08", "580.65.06"),
        ("3.9", "3.10"),
    ],
)
def test_vtuple_sorts_in_pep440_order(lower, higher):
    # Old vtuple took every digit run: 2.11.0rc1 -> (2, 11, 0, 1) sorted above 2.11.0 -> (2, 11, 0).
    assert pf.vtuple(lower) < pf.vtuple(higher)


def test_vtuple_agrees_with_packaging_where_it_is_importable():
    version = pytest.importorskip("packaging.version")
    texts = [
        "2.11.0rc1", "2.11.0", "2.11", "2.11.0.post1", "2.11.0.dev3", "2.11.0a1", "2.11.0b2", "2.11.0rc2",
        "2.11.0a1.dev1", "2.11.0.post1.dev2", "2.11.0a1.post1", "1.0-1", "1.0.post", "580.65.06", "13", "2.9.1",
    ]  # fmt: skip
    mine = sorted(texts, key=pf.vtuple)
    assert [version.Version(t) for t in mine] == sorted(version.Version(t) for t in texts)
    # Equal versions compare equal, as PEP 440 says (trailing zeros; a local label does not order here).
    assert pf.vtuple("2.11") == pf.vtuple("2.11.0") and pf.vtuple("2.13.0+cu130") == pf.vtuple("2.13.0")


def test_vtuple_reads_the_first_version_in_a_name():
    assert pf.vtuple("") == () and pf.vtuple("latest") == ()
    assert pf.vtuple("python3.11") == pf.vtuple("3.11") and pf.vtuple("cu130") > pf.vtuple("cu128")
    assert pf.release_tuple("580.65.06") == (580, 65, 6) and pf.release_tuple("2.11.0rc1") == (2, 11, 0)


def test_a_bare_branch_is_the_newest_of_its_branch():
    assert pf.driver_satisfies("580", "580.65.06") and not pf.driver_satisfies("575", "580.65.06")
    assert pf.driver_satisfies("580.95.05", "580.65.06") and not pf.driver_satisfies("580.65.05", "580.65.06")


# --- Python ranges: an empty range is an error, ceilings are what released wheels have -------------------------


@pytest.mark.parametrize("python", [[], ["3.10"], ["3.10", ""], None, ["3.14", "3.10"]])
def test_an_empty_python_range_is_refused_by_the_loader(python, tmp_path):
    # Old loader: 2.15's python [] read as "any Python", so EL8's Python 3.6 planned cu132 without a word.
    data = pf.load()
    data["torch"]["2.15"]["python"] = python
    path = tmp_path / "platform.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"torch 2\.15: python"):
        pf.load(path=path)
    # The same row from inventory is a plan error, not an exception.
    p = plan(torch={"version": "2.15.0"}, overrides={"torch": {"2.15": {"python": python}}})
    refused(p, "gpunode_platform_overrides", "torch 2.15: python")


def test_an_empty_architecture_list_is_refused_unless_the_build_is_extra():
    p = plan(overrides={"torch": {"2.13": {"variants": {"cu130": {"role": "stable", "sm": []}}}}})
    refused(p, "torch 2.13 cu130: sm")
    assert DATA["torch"]["2.13"]["variants"]["cu129"] == {"role": "extra", "sm": []}


def test_torch_215_on_el8_with_the_os_python_36_is_refused():
    p = plan(
        os=ROCKY8,
        torch={"version": "2.15.0", "python": "/usr/bin/python3", "python_version": "3.6"},
        driver={"branch": "580"},
    )
    text = refused(p, "supports Python 3.10 to 3.14", "3.6")
    assert "gpunode_pytorch_python" in text and "python3.11" in text
    # Absent the fault: the OS row's python3.11 is in range.
    assert ok(plan(os=ROCKY8, torch={"version": "2.15.0", "cuda": "cu130"}, driver={"branch": "580"}))


@pytest.mark.parametrize("minor", ["2.13", "2.14", "2.15"])
def test_python_ceilings_are_what_released_wheels_have(minor):
    # Old rows allowed 3.15 for 2.13/2.14 (RELEASE.md's text); test-infra keeps 3.15 out of released wheels.
    assert DATA["torch"][minor]["python"] == ["3.10", "3.14"]
    refused(plan(torch={"version": f"{minor}.0", "python": "python3.15"}, driver={"branch": "580"}), "3.15")
    ok(
        plan(
            torch={"version": f"{minor}.0", "python": "python3.14", "cuda": "cu130"}, driver={"branch": "580"}
        )
    )


# --- driver branch lifecycle ----------------------------------------------------------------------------------

TODAY = "2026-11-26"


def test_every_branch_row_has_a_type_end_of_life_and_source():
    for branch, row in DATA["driver_branches"].items():
        assert re.fullmatch(r"\d{3}", branch)
        assert row["type"] in ("long-term support", "production", "new feature", None), branch
        assert row["end_of_life"] is None or re.fullmatch(r"\d{4}-\d{2}|ended", row["end_of_life"]), branch
        assert len(row["source"]) > 20, branch
    # What NVIDIA's "Supported Drivers and CUDA Toolkit Versions" says, as of the date the facts were checked.
    life = {b: pf.branch_lifecycle(DATA, b, TODAY) for b in ("535", "570", "580", "595", "610", "620")}
    assert {b for b, v in life.items() if v["ended"]} == {"535", "570", "610"}
    assert life["580"]["end_of_life"] == "June 2028" and life["620"]["end_of_life"] == "September 2029"
    assert life["535"]["end_of_life"] == "June 2026" and life["595"]["type"] == "production"


def test_a_branch_is_supported_through_the_month_its_end_of_life_names():
    assert not pf.branch_lifecycle(DATA, "535", "2026-06-30")["ended"]
    assert pf.branch_lifecycle(DATA, "535.261.03", "2026-07-01")["ended"]
    assert not pf.branch_lifecycle(DATA, "999", TODAY)["known"]


def test_debian12_distro_driver_535_warns_and_names_the_branch_to_move_to():
    # Old plan installed Debian 12's 535 without a word; NVIDIA ended R535 in June 2026.
    p = ok(plan(os=DEBIAN12, gpus=[H100], today=TODAY))
    (warning,) = [w for w in p["warnings"] if "end of life" in w]
    assert "branch 535 reached its end of life in June 2026" in warning
    assert "set gpunode_driver_source: nvidia and gpunode_driver_branch: 580" in warning
    # Absent the fault: the same node on NVIDIA's 580 gets no lifecycle warning, nor does it before July 2026.
    p = ok(plan(os=DEBIAN12, gpus=[H100], driver={"source": "nvidia", "branch": "580"}, today=TODAY))
    assert not [w for w in p["warnings"] if "driver branch" in w]
    assert not ok(plan(os=DEBIAN12, gpus=[H100], today="2026-06-30"))["warnings"]


def test_an_ended_branch_for_a_volta_node_moves_to_the_last_branch_volta_has():
    p = ok(plan(gpus=[V100], driver={"branch": "570"}, torch={"cuda": "cu126"}, today=TODAY))
    assert "gpunode_driver_branch: 580" in " ".join(p["warnings"])
    # After June 2028 no supported branch serves Volta (its last is R580): the warning says so, naming none.
    p = plan(gpus=[V100], driver={"branch": "580"}, torch={"cuda": "cu126"}, today="2028-07-01")
    assert "no supported branch serves these GPUs" in " ".join(p["warnings"])


def test_a_new_feature_branch_and_an_unknown_branch_warn():
    p = plan(driver={"branch": "590"}, torch={"cuda": "cu126"}, today=TODAY)
    assert "new feature branch" in " ".join(p["warnings"]) and "gpunode_driver_branch: 580" in " ".join(
        p["warnings"]
    )
    p = plan(driver={"branch": "600"}, torch={"cuda": "cu126"}, today=TODAY)
    assert "not in the platform data's lifecycle table" in " ".join(p["warnings"])


# --- CUDA 13.x toolkit rows -------------------------------------------------------------------------------------


def test_cuda_13_rows_hold_their_own_release_notes_driver():
    assert {k: v["min_driver"] for k, v in DATA["cuda"].items() if k.startswith("13.")} == {
        "13.0": "580.65.06",
        "13.1": "590.44.01",
        "13.2": "595.45.04",
        "13.3": "610.43.02",
        # From 13.4 the notes name a branch (the toolkit bundles no Linux driver): R615, any 615 driver or later.
        "13.4": "615",
    }


def test_cuda_13_4_is_held_to_its_release_notes_branch():
    # Old plan: 13.4 was refused for want of a row (before that, planned from the 13.0 row's driver).
    # Minor-version compatibility (the default policy) runs it on >= 580, as its notes say.
    ok(plan(driver={"branch": "580"}, cuda={"version": "13.4"}, today=TODAY))
    # The toolkit policy holds it to R615: a 610 driver is refused, naming the supported branch to move to.
    text = refused(
        plan(driver={"branch": "610"}, torch={"policy": "toolkit"}, cuda={"version": "13.4"}, today=TODAY),
        "CUDA 13.4 needs driver of branch 615 or later; the driver is 610",
    )
    assert "gpunode_driver_branch: 620" in text and "gpunode_cuda_version: 13.3" in text
    # Absent the fault: a 615 or 620 driver (a branch or a whole version) meets it.
    for branch in ("615", "620", "615.71.09"):
        ok(
            plan(
                driver={"branch": branch}, torch={"policy": "toolkit"}, cuda={"version": "13.4"}, today=TODAY
            )
        )
    assert not pf.driver_satisfies("610.57.04", "615") and pf.driver_satisfies("615.71.09", "615")


@pytest.mark.parametrize("version", ["13.5"])
def test_a_toolkit_the_table_lacks_is_refused_not_planned_from_its_major(version):
    # Old plan: 13.5 got CUDA 13's minimum (the 13.0 row's driver) and was never held against its own notes.
    # 13.5 stays refused: its release notes' driver section was not read.
    text = refused(
        plan(driver={"branch": "580"}, cuda={"version": version}),
        f"CUDA {version} is not in the platform data",
    )
    assert "gpunode_cuda_version: 13.4" in text and "gpunode_platform_overrides" in text
    # Absent the fault: a site that read the row adds it, and the toolkit is planned against that row.
    row = {version: {"min_driver": "615.00.00", "source": "a test row"}}
    ok(plan(driver={"branch": "620"}, cuda={"version": version}, overrides={"cuda": row}))


def test_the_toolkit_policy_holds_a_13x_toolkit_to_its_own_driver():
    text = refused(
        plan(driver={"branch": "580"}, torch={"policy": "toolkit"}, cuda={"version": "13.3"}, today=TODAY),
        "CUDA 13.3 needs driver >= 610.43.02",
    )
    assert "gpunode_driver_branch: 620" in text and "gpunode_cuda_version: 13.0" in text
    # Absent the fault: minor-version compatibility runs 13.3 on 580, and 620 meets 13.3's own minimum.
    ok(plan(driver={"branch": "580"}, cuda={"version": "13.3"}))
    ok(plan(driver={"branch": "620"}, torch={"policy": "toolkit"}, cuda={"version": "13.3"}))


# --- torch rows back to 2.9 ---------------------------------------------------------------------------------------


def test_rows_back_to_29_exist_with_their_published_builds():
    assert {"2.9", "2.10", "2.11"} <= set(DATA["torch"])
    assert DATA["torch"]["2.9"]["default"] == DATA["torch"]["2.10"]["default"] == "cu128"
    assert DATA["torch"]["2.11"]["default"] == "cu130"
    for minor in ("2.9", "2.10", "2.11"):
        assert DATA["torch"][minor]["python"] == ["3.10", "3.14"]


def test_a_site_pinned_to_211_on_a_570_driver_gets_cu128():
    # Old data had no row before 2.12, so torch 2.11 (the last release with cu128) could not be planned at all.
    p = ok(plan(torch={"version": "2.11.0"}, driver={"branch": "570"}, today=TODAY))
    assert p["torch"]["tag"] == "cu128"
    assert (p["cuda"]["cudnn"], p["cuda"]["nccl"]) == ("9.17.1.4", "2.28.9")
    # 2.11's cu126 pins another cuDNN than its cu128: the build's own row wins over the major's.
    p = ok(plan(torch={"version": "2.11.0", "cuda": "cu126"}, driver={"branch": "570"}, today=TODAY))
    assert p["cuda"]["cudnn"] == "9.10.2.21"
    assert ok(plan(torch={"version": "2.11.0"}, driver={"branch": "580"}))["torch"]["tag"] == "cu130"


def test_volta_keeps_cu128_through_210_and_loses_it_in_211():
    assert (
        ok(plan(gpus=[V100], torch={"version": "2.10.0"}, driver={"branch": "570"}))["torch"]["tag"]
        == "cu128"
    )
    assert (
        ok(plan(gpus=[V100], torch={"version": "2.11.0"}, driver={"branch": "570"}))["torch"]["tag"]
        == "cu126"
    )
    refused(plan(gpus=[V100], torch={"version": "2.11.0", "cuda": "cu128"}), "no sm_70 kernels")


# --- every refusal names the nearest working choice and the variable that sets it ------------------------------

UBUNTU26 = {"distribution": "Ubuntu", "major": "26", "family": "Debian"}
UNKNOWN_OS = {"distribution": "Plan9", "major": "4", "family": "Plan9"}

# (case, plan arguments, the variable to change, the concrete choice it names). Ids say what is refused.
REFUSALS = [
    ("override not a mapping", {"overrides": ["x"]}, "gpunode_platform_overrides", "mapping"),
    ("unsupported OS", {"os": UBUNTU26}, "gpunode_base_enforce_supported_os", "Ubuntu 24"),
    ("unknown OS", {"os": UNKNOWN_OS}, "gpunode_base_enforce_supported_os", "Ubuntu 24"),
    ("no distro driver", {"driver": {"source": "distro"}}, "gpunode_driver_source: nvidia", "580"),
    (
        "branch distro lacks",
        {"os": DEBIAN12, "driver": {"branch": "580"}},
        "gpunode_driver_source: nvidia",
        "580",
    ),
    (
        "branch below the GPU's first",
        {"gpus": [B200], "driver": {"branch": "535"}},
        "gpunode_driver_branch",
        "580",
    ),
    (
        "branch above the GPU's last",
        {"gpus": [V100], "driver": {"branch": "595"}},
        "gpunode_driver_branch",
        "580",
    ),
    ("flavour not a flavour", {"driver": {"open": "maybe"}}, "gpunode_driver_open_kernel_modules", "auto"),
    ("Blackwell proprietary", {"gpus": [B200], "driver": {"open": "false"}}, "open_kernel_modules", "auto"),
    (
        "Volta open",
        {"gpus": [V100], "driver": {"open": "true"}},
        "gpunode_driver_open_kernel_modules",
        "auto",
    ),
    (
        "distro open lags",
        {"os": DEBIAN12, "gpus": [T4], "driver": {"open": "true"}},
        "source: nvidia",
        "false",
    ),
    ("policy not a policy", {"torch": {"policy": "loose"}}, "gpunode_pytorch_driver_policy", "compat"),
    ("torch not a version", {"torch": {"version": "latest"}}, "gpunode_pytorch_version", "2.14.0"),
    ("torch the data lacks", {"torch": {"version": "2.99.0"}}, "gpunode_pytorch_version", "2.14.0"),
    ("Python out of range", {"torch": {"python": "python3.9"}}, "gpunode_pytorch_python", "python3.11"),
    ("auto without a GPU", {"gpus": []}, "gpunode_pytorch_cuda", "cpu"),
    (
        "no build serves the node",
        {"gpus": [B200], "driver": {"branch": "570"}},
        "gpunode_pytorch_version",
        "2.11.0",
    ),
    ("CUDA build not a build", {"torch": {"cuda": "twelve"}}, "gpunode_pytorch_cuda", "cu130"),
    ("build the release lacks", {"torch": {"cuda": "cu128"}}, "gpunode_pytorch_version", "2.11"),
    (
        "build without the GPU's kernels",
        {"gpus": [V100], "torch": {"cuda": "cu130"}},
        "gpunode_pytorch_cuda",
        "cu126",
    ),
    ("CUDA version not a version", {"cuda": {"version": "abc"}}, "gpunode_cuda_version", "13.0"),
    (
        "CUDA of another major",
        {"driver": {"branch": "580"}, "cuda": {"version": "12.8"}},
        "gpunode_cuda_version",
        "13.0",
    ),
    ("no CUDA to follow", {"gpus": [], "torch": {"cuda": "cpu"}}, "gpunode_cuda_enabled", "false"),
    ("no distro toolkit", {"cuda": {"source": "distro"}}, "gpunode_cuda_source", "pip"),
    (
        "distro toolkit of another major",
        {"os": DEBIAN12, "cuda": {"source": "distro"}},
        "gpunode_cuda_source",
        "pip",
    ),
    ("toolkit the data lacks", {"cuda": {"version": "13.5"}}, "gpunode_cuda_version", "13.4"),
    (
        "toolkit newer than the driver",
        {"driver": {"branch": "580"}, "torch": {"policy": "toolkit"}, "cuda": {"version": "13.3"}},
        "gpunode_driver_branch",
        "620",
    ),
]
# Refusals no variable can fix, named as such: one driver cannot serve a Blackwell and a Volta GPU.
UNFIXABLE = [
    ("Blackwell beside Volta", {"gpus": [B200, V100]}, "no variable changes that", "split these GPUs")
]


def _refusal_plan(args):
    args = dict(args)
    return plan(
        os=args.pop("os", ROCKY9),
        gpus=args.pop("gpus", (H100,)),
        driver=args.pop("driver", None),
        torch=args.pop("torch", None),
        cuda=args.pop("cuda", None),
        today=TODAY,
        **args,
    )


@pytest.mark.parametrize(("case", "args", "variable", "choice"), REFUSALS + UNFIXABLE, ids=lambda x: x)
def test_every_refusal_names_the_nearest_choice_and_its_variable(case, args, variable, choice):
    text = refused(_refusal_plan(args))
    assert variable in text, (case, text)
    assert re.search(rf"(?<![\w.]){re.escape(choice)}(?![\w])", text), (case, choice, text)


def test_the_refusal_table_walks_every_refusal_path_of_the_plan():
    # Trace node_plan over the table: every errors.append in its source must have run at least once, so a new
    # refusal path without a row (and so without a named way out) fails here.
    import inspect
    import sys

    code = pf.node_plan.__code__
    lines, start = inspect.getsourcelines(pf.node_plan)
    sites = {start + i for i, line in enumerate(lines) if "errors.append(" in line}
    hit: set[int] = set()

    def tracer(frame, event, arg):
        if frame.f_code is code:
            if event == "line" and frame.f_lineno in sites:
                hit.add(frame.f_lineno)
            return tracer
        return None

    sys.settrace(tracer)
    try:
        for _case, args, _variable, _choice in REFUSALS + UNFIXABLE:
            _refusal_plan(args)
    finally:
        sys.settrace(None)
    assert hit == sites, f"refusal lines no case reaches: {sorted(sites - hit)}"
