"""node_plan's stages, each run alone on a Planning that the stages before it prepared: what it settles when the
input is sound, and what it says when the fault is planted (hostcheck/platform.py, STAGES)."""

from __future__ import annotations

import pytest

from hostcheck import platform as pf

H100 = "0x2330"
ROCKY9 = {"distribution": "Rocky", "major": "9", "family": "RedHat"}


def upto(stage, os=ROCKY9, gpus=(H100,), driver=None, torch=None, cuda=None) -> pf.Planning:
    """A Planning with every stage before ``stage`` run (each must pass)."""
    p = pf.Planning(
        pf.load(),
        os,
        list(gpus),
        driver,
        {"version": "2.13.0", **(torch or {})},
        {"source": "pip", **(cuda or {})},
    )
    for before in pf.STAGES[: pf.STAGES.index(stage)]:
        assert before(p), (before.__name__, p.errors)
    return p


def test_the_pipeline_is_the_stages_in_order():
    names = [s.__name__ for s in pf.STAGES]
    assert names[0] == "stage_os" and names[-1] == "stage_finish" and len(set(names)) == len(names)
    assert pf.node_plan(os=ROCKY9, gpus=[H100], torch={"version": "2.13.0"}, cuda={"source": "pip"})["ok"]


def test_stage_os():
    p = upto(pf.stage_os)
    assert pf.stage_os(p) and p.os_row["family"] == "RedHat" and p.plan["os"]["supported"]
    p = upto(pf.stage_os, os={"distribution": "Plan9", "major": "4", "family": "Bell"})
    assert not pf.stage_os(p) and "Plan9" in p.errors[0] and "not a supported OS" in p.errors[0]


def test_stage_gpus():
    p = upto(pf.stage_gpus)
    assert pf.stage_gpus(p) and p.found[0]["sm"] and p.warnings == []
    p = upto(pf.stage_gpus, gpus=("0xdead",))
    assert pf.stage_gpus(p) and "0xdead" in p.warnings[0] and "not in the platform data" in p.warnings[0]


def test_stage_driver():
    p = upto(pf.stage_driver)
    assert pf.stage_driver(p) and p.errors == [] and p.judged == p.branch != ""
    p = upto(pf.stage_driver, gpus=("0x2901",), driver={"branch": "550"})  # a B200 needs 570 or later
    assert pf.stage_driver(p) and "needs driver branch >= 570, not 550" in " ".join(p.errors)
    p = upto(pf.stage_driver, driver={"enabled": False, "installed": "580.65.06"})
    assert pf.stage_driver(p) and p.judged == "580.65.06"


def test_stage_flavour():
    p = upto(pf.stage_flavour)
    assert pf.stage_flavour(p) and p.plan["driver"]["flavour"] in ("open", "proprietary") and p.errors == []
    p = upto(pf.stage_flavour, driver={"open": "maybe"})
    assert pf.stage_flavour(p) and "must be auto, true or false, not 'maybe'" in p.errors[0]


def test_stage_python():
    p = upto(pf.stage_python)
    assert pf.stage_python(p) and p.pyname == p.os_row["python"]["name"] and p.pyver
    p = upto(pf.stage_python, torch={"python": "python3.12"})
    assert pf.stage_python(p) and (p.pyver, p.plan["python"]["packages"]) == ("3.12", [])


@pytest.mark.parametrize(
    ("torch", "said"),
    [
        ({"version": "9.9.0"}, "torch 9.9.0 is not in the platform data"),
        ({"policy": "newest"}, "gpunode_pytorch_driver_policy must be one of"),
        ({"version": "two"}, "gpunode_pytorch_version:"),
    ],
)
def test_stage_torch_release_refuses(torch, said):
    p = upto(pf.stage_torch_release, torch=torch)
    assert not pf.stage_torch_release(p) and said in p.errors[0]


def test_stage_torch_release_takes_a_known_release():
    p = upto(pf.stage_torch_release)
    assert pf.stage_torch_release(p) and p.minor == "2.13" and p.row["variants"] and p.errors == []


def test_stage_torch_build():
    p = upto(pf.stage_torch_build)
    assert pf.stage_torch_build(p) and p.tag.startswith("cu") and p.errors == []
    p = upto(pf.stage_torch_build, gpus=())
    assert not pf.stage_torch_build(p) and "no NVIDIA GPU on the PCI bus" in p.errors[0]
    p = upto(pf.stage_torch_build, torch={"cuda": "cu999"})
    assert not pf.stage_torch_build(p) and "has no cu999 build" in p.errors[0]
    p = upto(pf.stage_torch_build, torch={"cuda": "cpu"})
    assert pf.stage_torch_build(p) and p.tag == "cpu"


def test_stage_torch_plan():
    p = upto(pf.stage_torch_plan)
    assert pf.stage_torch_plan(p)
    assert (p.plan["torch"]["tag"], p.plan["torch"]["minor"]) == (p.tag, "2.13") and p.plan["torch"][
        "min_driver"
    ]


def test_stage_cuda():
    p = upto(pf.stage_cuda)
    assert pf.stage_cuda(p) and p.plan["cuda"]["major"] == pf.cuda_normalize(p.tag).partition(".")[0]
    assert p.errors == []
    p = upto(pf.stage_cuda, cuda={"version": "11.8"})
    assert pf.stage_cuda(p) and "must match torch's CUDA major" in " ".join(p.errors)
    p = upto(pf.stage_cuda, cuda={"version": "x.y"})
    assert not pf.stage_cuda(p) and p.errors[0].startswith("gpunode_cuda_version:")


def test_stage_finish():
    p = upto(pf.stage_finish)
    assert pf.stage_finish(p) and p.plan["ok"] and p.plan["sm"] and p.plan["os"]["family"] == "RedHat"
    p = upto(pf.stage_finish)
    p.errors += ["twice", "twice"]
    assert pf.stage_finish(p) and not p.plan["ok"] and p.plan["errors"] == ["twice"]
