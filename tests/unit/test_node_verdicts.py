"""Node-check verdicts that must not lie: torch's import error kept, checks reading only the gatherers they
declare (so `--only ID` works for every check), and LD_PRELOAD entries that do not load."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import hostcheck_scenarios as S
import pytest

from hostcheck import command
from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather import GATHERERS
from hostcheck.gather.base import BUSY, Unavailable
from hostcheck.gather.torchinfo import gather_torch
from hostcheck.registry import Status, run_check

UNDEFINED = "ImportError: /opt/gpunode/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommWindowRegister"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def judge(snapshot):
    core = [c for c in all_checks() if c.category != "workload"]
    results, _ = evaluate(snapshot, core)
    return {r.id: r for r in results}


def no_tuning_facts():
    return {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}


# ------------------------------------------------------------------------------------ torch.E001's text


@pytest.mark.parametrize(
    "torch_info",
    [
        {"installed": True, "error": UNDEFINED},  # today's probe
        {"installed": False, "error": UNDEFINED.split(": ", 1)[1]},  # a probe that filed it as not installed
    ],
)
def test_torch_that_does_not_import_keeps_the_error_text(torch_info):
    probe = S.h100_probe()
    probe["torch"] = torch_info
    r = judge(S.make_snapshot(probe=probe))["torch.E001"]
    assert r.status is Status.FAIL
    assert "is installed in /opt/gpunode/venv/bin/python" in r.message and "but does not import" in r.message
    assert "undefined symbol: ncclCommWindowRegister" in r.message
    assert "not installed" not in r.message


def test_torch_missing_is_still_not_installed():
    probe = S.h100_probe()
    probe["torch"] = {"installed": False, "error": "No module named 'torch'"}
    r = judge(S.make_snapshot(probe=probe))["torch.E001"]
    assert r.status is Status.FAIL and "torch is not installed" in r.message
    assert judge(S.make_snapshot())["torch.E001"].status is Status.PASS


def _fake_torch(tmp_path, body):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(body)
    return str(site)


def test_the_probe_tells_a_broken_torch_from_a_missing_one(tmp_path):
    site = _fake_torch(tmp_path, "raise ImportError('libtorch_cuda.so: undefined symbol: ncclX')\n")
    snap = gather_torch(sys.executable, "test", {"PYTHONPATH": site}, timeout_s=30)
    assert snap.error is None, snap.error
    assert snap.torch == {
        "installed": True,
        "error": "ImportError: libtorch_cuda.so: undefined symbol: ncclX",
    }
    # A dependency of torch that is missing is a broken torch too, not a missing one.
    site = _fake_torch(tmp_path / "dep", "import typing_extensions_not_here\n")
    snap = gather_torch(sys.executable, "test", {"PYTHONPATH": site}, timeout_s=30)
    assert snap.torch["installed"] is True and "typing_extensions_not_here" in snap.torch["error"]


def test_the_probe_says_not_installed_when_there_is_no_torch(tmp_path):
    python = tmp_path / "python"  # this interpreter without site-packages: no torch
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    snap = gather_torch(str(python), "test", {}, 30)
    assert snap.error is None, snap.error
    assert snap.torch["installed"] is False and "No module named 'torch'" in snap.torch["error"]


# --------------------------------------------------------------------- declared gatherers and --only


class _OnlyDeclared:
    """A snapshot that raises when a check reads a gatherer's part it did not declare in ``needs``."""

    def __init__(self, snap, needs):
        self._snap, self._needs = snap, needs

    def __getattr__(self, name):
        if name in GATHERERS and name != "facts" and name not in self._needs:
            raise AssertionError(f"read snapshot.{name} without declaring it")
        return getattr(self._snap, name)


def _variants():
    out = {name: factory() for name, (factory, _) in S.SCENARIOS.items()}
    broken = S.h100_probe()
    broken["torch"] = {"installed": True, "error": UNDEFINED}
    out["torch_broken"] = S.make_snapshot(probe=broken)
    missing = S.h100_probe()
    missing["torch"] = {"installed": False, "error": "No module named 'torch'"}
    out["torch_missing"] = S.make_snapshot(probe=missing)
    out["torch_missing_no_nvml"] = dataclasses.replace(
        S.SCENARIOS["no_nvml"][0](), torch=S.make_snapshot(probe=missing).torch
    )
    out["cpu_torch"] = S.make_snapshot(probe=S.h100_probe(torch={"cuda": None, "cuda_available": False}))
    return out


@pytest.mark.parametrize("check", all_checks(), ids=lambda c: c.id)
def test_every_check_reads_only_the_gatherers_it_declares(check):
    for name, snap in _variants().items():
        r = run_check(check, _OnlyDeclared(snap, check.needs))
        assert "without declaring it" not in r.message, (name, r.message)


@pytest.fixture
def gather_only_needed(monkeypatch):
    """The CLI's gatherer returns only the parts it was asked for, as the real one does."""
    asked = []

    def apply(snap):
        def fake(options, needs):
            asked.append(set(needs))
            parts = {k: None for k in ("system", "nvml", "torch", "tuning", "datapath") if k not in needs}
            if "workload" in needs:
                parts["workload"] = Unavailable(BUSY, "a Slurm job runs on this node")
            return dataclasses.replace(snap, options=options, **parts)

        monkeypatch.setattr("hostcheck.gather.gather", fake)
        return asked

    return apply


@pytest.mark.parametrize("check", all_checks(), ids=lambda c: c.id)
@pytest.mark.parametrize("node", ["healthy_8x_h100", "torch_missing"])
def test_only_runs_each_check_alone_without_error(check, node, gather_only_needed, capsys):
    snap = _variants()[node]
    asked = gather_only_needed(snap)
    # The default profile runs no GPU job: a workload check is asked for with the profile that runs it.
    profile = ["--profile", "full"] if check.workload else []
    rc = command.main(["--json", *profile, "--only", check.id])
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)
    assert [c["id"] for c in doc["checks"]] == [check.id]
    assert doc["checks"][0]["status"] != "error", doc["checks"][0]
    assert asked == [set(check.needs) & set(GATHERERS)]


def test_only_torch_e001_gathers_what_its_hint_reads(gather_only_needed, capsys):
    """The command a drain reason points an admin to: it once died with AttributeError on os_id."""
    asked = gather_only_needed(_variants()["torch_missing"])
    rc = command.main(["--json", "--only", "torch.E001"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["checks"][0]["status"] == "fail"
    assert "gpunode_pytorch_index: cu130" in doc["checks"][0]["hint"]
    assert asked[0] >= {"torch", "nvml", "system"}


# --------------------------------------------------------------------------------------- LD_PRELOAD


def _preload_probe(entry, exists, loaded, mapped=()):
    return S.h100_probe(
        env={"LD_PRELOAD": entry, "OMP_NUM_THREADS": "14"},
        maps={"jemalloc": [p for p in mapped if "jemalloc" in p], "tcmalloc": [], "openmp": []},
        symbols={"mallctl": bool(mapped)},
        preload=[{"entry": entry, "exists": exists, "loaded": loaded}],
    )


def _facts_allocator(value):
    facts = S.h100_facts()
    facts["gpunode_tuning"]["allocator"] = value
    return facts


@pytest.mark.parametrize("intent", ["none", "tcmalloc", "jemalloc", None])
def test_a_preload_of_a_missing_library_fails_whatever_the_fact_says(intent):
    facts = _facts_allocator(intent) if intent else no_tuning_facts()
    probe = _preload_probe("/nonexistent/libjemalloc.so.2", exists=False, loaded=False)
    r = judge(S.make_snapshot(probe=probe, facts=facts))["tuning.E002"]
    assert r.status is Status.FAIL, r
    assert "/nonexistent/libjemalloc.so.2 (does not exist)" in r.message
    assert "fix the path in /etc/gpunode/training.env" in r.hint


def test_with_the_fact_none_and_no_preload_glibc_passes():
    probe = S.h100_probe(env={"OMP_NUM_THREADS": "14"}, maps={"jemalloc": [], "tcmalloc": []}, symbols={})
    r = judge(S.make_snapshot(probe=probe, facts=_facts_allocator("none")))["tuning.E002"]
    assert r.status is Status.PASS


def test_a_broken_jemalloc_preload_without_facts_is_told_to_fix_the_path_not_to_use_tcmalloc():
    # An older probe without the per-entry list: judged from the mapped allocators.
    probe = S.h100_probe(
        env={"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, maps={"jemalloc": [], "tcmalloc": []}, symbols={}
    )
    tuning = S.h100_tuning(allocator_libs={"jemalloc": (JEMALLOC,), "tcmalloc": ()})
    r = judge(S.make_snapshot(probe=probe, facts=no_tuning_facts(), tuning=tuning))["tuning.E002"]
    assert r.status is Status.FAIL
    assert "fix the path" in r.hint and f"jemalloc is installed at {JEMALLOC}" in r.hint
    assert "tcmalloc" not in r.hint and "tcmalloc" not in r.message


def test_a_jemalloc_preload_that_loads_is_judged_on_its_settings_not_as_broken():
    probe = _preload_probe(JEMALLOC, exists=True, loaded=True, mapped=(JEMALLOC,))
    r = judge(S.make_snapshot(probe=probe, facts=no_tuning_facts()))["tuning.E002"]
    assert r.status is Status.WARN and "default settings" in r.message  # the measured slowdown, not a path


def test_the_probe_lists_each_preload_entry_and_whether_it_loaded():
    libm = next(
        (
            p
            for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6")
            if os.path.exists(p)
        ),
        None,
    )
    if libm is None:
        pytest.skip("no libm at a known path")
    env = {"LD_PRELOAD": f"/nonexistent/libjemalloc.so.2 {libm}"}
    snap = gather_torch(sys.executable, "test", env, 30, with_torch=False)
    assert snap.error is None, snap.error
    assert snap.data["preload"] == [
        {"entry": "/nonexistent/libjemalloc.so.2", "exists": False, "loaded": False},
        {"entry": libm, "exists": True, "loaded": True},
    ]
