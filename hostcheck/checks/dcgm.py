"""DCGM's verdicts (gpu.E030-E034): each test of ``dcgmi diag`` mapped to a check of its DCGM category, with DCGM's
own message and error code, and DCGM's health watches. A test DCGM skipped or did not run is said apart from one
that failed; a dcgmi that could not run is an error, never a fail. Pure functions of the Snapshot; the running and
parsing is hostcheck.gather.dcgm, the levels per profile hostcheck.profiles (docs/dcgm.md)."""

from __future__ import annotations

from typing import Any

from hostcheck.gather.base import BUSY, NOT_FOUND, Unavailable
from hostcheck.gather.dcgm import (
    FAIL,
    HEALTH_FAIL,
    HEALTH_WARN,
    HEALTHY,
    NOT_RUN,
    PASS,
    SKIP,
    WARN,
    DcgmSnapshot,
    DiagReport,
    DiagResult,
)
from hostcheck.registry import Outcome, check, errored, failed, passed, plural, skipped, warned

INSTALL_HINT = (
    "install DCGM (NVIDIA's datacenter-gpu-manager package and its nvidia-dcgm service): "
    "gpunode_driver_dcgm_enabled: true (docs/dcgm.md)"
)
ENGINE_HINT = (
    "start DCGM's host engine ('systemctl enable --now nvidia-dcgm') and set its health watches on all GPUs "
    "('dcgmi health -s a'); see docs/dcgm.md"
)
RUN_HINT = (
    "run 'dcgmi diag -r {level} -j' by hand to see why; is nv-hostengine (the nvidia-dcgm service) running?"
)
FIX = (
    "re-run 'dcgmi diag -r {level}' to confirm, look the DCGM error code up in DCGM's Diagnostic Errors reference "
    "(docs/dcgm.md), then drain the node and have the GPU looked at with that output"
)
#: DCGM's test categories (nvvs/include/PluginStrings.h PLUGIN_CATEGORY_*; 3.x dcgmi/Diag.cpp DISPLAY_*), by check.
BUCKETS = {"deployment": "gpu.E030", "integration": "gpu.E031", "hardware": "gpu.E032", "stress": "gpu.E033"}
#: A category DCGM adds later is judged with the hardware tests: never dropped.
OTHER = "gpu.E032"
#: DCGM's software plugin (nvvs/include/PluginStrings.h: SW_PLUGIN_NAME "software", SW_PLUGIN_CATEGORY
#: Deployment) checks the driver, libraries and permissions, not the GPU: its results are deployment results
#: whatever category a dcgmi prints them under (3.1 prints them as "Custom"), never hardware faults.
SOFTWARE_TESTS = ("software",)


def _bucket(r: DiagResult) -> str:
    if r.test.lower() in SOFTWARE_TESTS:
        return BUCKETS["deployment"]
    return BUCKETS.get(r.category.lower(), OTHER)


def _dcgm(s: Any) -> DcgmSnapshot | Outcome:
    d = getattr(s, "dcgm", None)
    if not isinstance(d, DcgmSnapshot):
        return skipped("DCGM not gathered")
    if d.dcgmi is None:
        return skipped("DCGM not installed (no dcgmi)", hint=INSTALL_HINT)
    return d


def _diag(s: Any, cid: str) -> DiagReport | Outcome:
    d = _dcgm(s)
    if isinstance(d, Outcome):
        return d
    if d.diag is None:
        return skipped("this profile runs no DCGM diagnostic (passive: the health watches only, gpu.E034)")
    level = d.level
    why = d.diag.reason if isinstance(d.diag, Unavailable) else d.diag.runtime_error
    if not why:
        return d.diag
    if isinstance(d.diag, Unavailable) and d.diag.kind == BUSY:
        return skipped(f"dcgmi diag -r {level} {why}")
    if cid != "gpu.E030":  # one error for one run that could not happen, not four
        return skipped(f"dcgmi diag -r {level} did not run (gpu.E030 says why)")
    said = "DCGM says: " if not isinstance(d.diag, Unavailable) else ""
    return errored(f"dcgmi diag -r {level} could not run: {said}{why}", hint=RUN_HINT.format(level=level))


def _where(r: DiagResult) -> str:
    return f"{r.test} on {r.entity}" if r.entity else r.test


def _said(r: DiagResult) -> str:
    if r.messages:
        return "; ".join(str(m) for m in r.messages)
    return "; ".join(r.info) or f"DCGM reports {r.status} without a message"


def _judge(s: Any, cid: str, label: str) -> Outcome:
    diag = _diag(s, cid)
    if isinstance(diag, Outcome):
        return diag
    rows = [r for r in diag.results if _bucket(r) == cid]
    if not rows:
        return skipped(f"dcgmi diag -r {diag.level} ran no {label} test")
    version = f"DCGM {diag.version}, " if diag.version else ""
    details = tuple(
        f"{r.category}/{_where(r)}: {r.status}" + (f": {_said(r)}" if r.status != PASS else "") for r in rows
    )
    fails = [f"{_where(r)}: {_said(r)}" for r in rows if r.status == FAIL]
    warns = [f"{_where(r)}: {_said(r)}" for r in rows if r.status == WARN]
    unknown = [
        f"{_where(r)}: status '{r.status}' not known to hostcheck, not judged"
        for r in rows
        if r.status not in (PASS, FAIL, WARN, SKIP, NOT_RUN)
    ]
    notrun = [f"{_where(r)} {r.status}: {_said(r)}" for r in rows if r.status in (SKIP, NOT_RUN)]
    hint = FIX.format(level=diag.level)
    value = len(fails)  # DCGM results that failed: a count, for the report and Prometheus
    if fails:
        return failed("DCGM " + "; ".join(fails + warns), hint=hint, value=value, details=details)
    if diag.dropped:  # what was not read may hold a failure: never a pass
        unknown.append(
            f"{plural(diag.dropped, 'result')} past the first {len(diag.results)} not read, not judged"
        )
    if warns or unknown:
        return warned("DCGM " + "; ".join(warns + unknown), hint=hint, value=value, details=details)
    passes = sum(r.status == PASS for r in rows)
    if not passes:
        return skipped(
            f"DCGM {label} tests could not run: " + "; ".join(notrun), value=value, details=details
        )
    msg = f"{plural(passes, f'DCGM {label} result')} passed ({version}dcgmi diag -r {diag.level})"
    if notrun:
        msg += f"; not run: {'; '.join(notrun)}"
    return passed(msg, value=value, details=details)


@check("gpu.E030", "DCGM diagnostic: deployment tests (dcgmi diag)", weight=5, needs=("dcgm",))
def dcgm_deployment(s: Any) -> Outcome:
    return _judge(s, "gpu.E030", "deployment")


@check("gpu.E031", "DCGM diagnostic: integration tests (PCIe)", weight=5, needs=("dcgm",))
def dcgm_integration(s: Any) -> Outcome:
    return _judge(s, "gpu.E031", "integration")


@check("gpu.E032", "DCGM diagnostic: hardware tests (memory, diagnostic)", weight=8, needs=("dcgm",))
def dcgm_hardware(s: Any) -> Outcome:
    return _judge(s, "gpu.E032", "hardware")


@check(
    "gpu.E033",
    "DCGM diagnostic: stress tests (targeted stress and power, bandwidth)",
    weight=5,
    needs=("dcgm",),
)
def dcgm_stress(s: Any) -> Outcome:
    return _judge(s, "gpu.E033", "stress")


@check("gpu.E034", "DCGM health watches (dcgmi health)", weight=5, needs=("dcgm",))
def dcgm_health(s: Any) -> Outcome:
    d = _dcgm(s)
    if isinstance(d, Outcome):
        return d
    h = d.health
    if h is None:
        return skipped("DCGM's health watches not read")
    if isinstance(h, Unavailable):
        if h.kind == NOT_FOUND:
            return skipped(f"DCGM health watches: {h.reason}", hint=ENGINE_HINT)
        return errored(f"dcgmi health -c could not run: {h.reason}", hint=ENGINE_HINT)
    said = [f"{i.entity} {i.system}: {i.message or i.health}" for i in h.incidents]
    details = tuple(f"{i.entity} {i.system}: {i.health}: {i.message}" for i in h.incidents)
    bad = [t for i, t in zip(h.incidents, said) if i.health == HEALTH_FAIL]
    hint = "DCGM's health watches name the subsystem: see its message, and drain the node if it is a failure"
    if bad or h.overall == HEALTH_FAIL:
        return failed(
            "DCGM health: " + "; ".join(bad or said or ["overall Failure"]), hint=hint, details=details
        )
    if said or h.overall != HEALTHY:
        what = said or [
            f"overall health '{h.overall}'" + ("" if h.overall == HEALTH_WARN else " (not known)")
        ]
        return warned("DCGM health: " + "; ".join(what), hint=hint, details=details)
    return passed("DCGM health watches: Healthy")
