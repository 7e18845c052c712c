"""Plugging the workload checks into hostcheck's core (registry + extra gatherer), in one call::

    # hostcheck/checks/workload.py
    from hostcheck.workload.integration import register_all

    register_all()

``register_all`` registers the gatherer ``workload`` (:func:`gather_for_hostcheck`) and one check per id in
:data:`hostcheck.workload.api.CHECKS`, each a pure function of ``snapshot.extra["workload"]``. The core
modules are imported lazily here, so the rest of this subpackage does not depend on them.

Options read from the core's ``Options`` when present (``getattr`` with these defaults):
``burn`` (0.0 s), ``nnodes`` / ``rdzv_endpoint`` / ``rdzv_id`` ("hostcheck") / ``nproc_per_node`` (None),
``workload_timeout_s`` (180 s for the probe process), ``workload_device`` ("auto").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hostcheck.workload.api import (
    CHECKS,
    GpuLink,
    MultiNode,
    WorkloadFinding,
    WorkloadRun,
    gather_workload,
    gpus_from_nvml,
    judge_workload,
)

#: Slack over the sum of the children's own deadlines (process start-up, judging) before the gatherer is cut.
GATHER_SLACK_S = 60.0


def gather_limit(options: Any) -> float:
    """The whole workload run's ceiling, from the options: every child has its own hard deadline (suite and
    the re-run of what it never reached, two DDP launch tries, the multi-node rendezvous, burn), and this
    bounds their sum, so a bug in the sequencing cannot hang a run either."""
    t = float(getattr(options, "workload_timeout_s", 180.0) or 180.0)
    rdzv = (
        float(getattr(options, "rdzv_timeout_s", 300.0) or 300.0) if getattr(options, "nnodes", None) else 0.0
    )
    burn = float(getattr(options, "burn", 0.0) or 0.0)
    return 2 * t + 2 * t + rdzv + ((burn + t) if burn > 0 else 0.0) + GATHER_SLACK_S


GATHERER = "workload"


@dataclass(frozen=True)
class WorkloadGathered:
    """What the gatherer leaves in ``snapshot.extra["workload"]``."""

    run: WorkloadRun
    gpus: tuple[GpuLink, ...] = ()

    def findings(self) -> list[WorkloadFinding]:
        return judge_workload(self.run, list(self.gpus))

    def finding(self, cid: str) -> WorkloadFinding:
        for f in self.findings():
            if f.id == cid:
                return f
        raise KeyError(cid)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run.to_dict(), "gpus": [g.__dict__ for g in self.gpus]}


def _python_and_env(options: Any, parts: dict[str, Any]) -> tuple[str, dict[str, str]]:
    torch_part = parts.get("torch")
    python = getattr(torch_part, "python", None)
    facts = parts.get("facts")
    if not python:
        from hostcheck.gather.torchinfo import choose_python

        python, _ = choose_python(getattr(options, "python", None), facts)
    env: dict[str, str] = {}
    try:
        from hostcheck.gather import gather_tuning_env
        from hostcheck.gather.tuning import DEFAULT_ENV_FILE

        env_file = getattr(options, "env_file", None)
        if not env_file and facts is not None:
            env_file = facts.get("gpunode_tuning", "env_file")
        env = gather_tuning_env(env_file or DEFAULT_ENV_FILE)
    except Exception:  # the training env is a refinement: run without it rather than not at all
        env = {}
    return python, env


def gather_for_hostcheck(options: Any, parts: dict[str, Any]) -> WorkloadGathered:
    """The core's extra-gatherer signature: ``fn(options, parts)``; parts holds the core snapshots."""
    python, env = _python_and_env(options, parts)
    mn = None
    if getattr(options, "nnodes", None) and getattr(options, "rdzv_endpoint", None):
        mn = MultiNode(
            nnodes=str(options.nnodes),
            rdzv_endpoint=str(options.rdzv_endpoint),
            nproc_per_node=getattr(options, "nproc_per_node", None),
            rdzv_id=getattr(options, "rdzv_id", None) or "hostcheck",
            timeout=float(getattr(options, "rdzv_timeout_s", 300.0) or 300.0),
        )
    gpus = tuple(gpus_from_nvml(parts.get("nvml")))
    run = gather_workload(
        python,
        burn=float(getattr(options, "burn", 0.0) or 0.0),
        timeout=float(getattr(options, "workload_timeout_s", 180.0) or 180.0),
        env=env,
        device=getattr(options, "workload_device", None) or "auto",
        multinode=mn,
    )
    return WorkloadGathered(run=run, gpus=gpus)


def to_outcome(f: WorkloadFinding) -> Any:
    """A WorkloadFinding as the core's Outcome."""
    from hostcheck.registry import Outcome, Status

    return Outcome(
        Status(f.status),
        f.message,
        value=f.value,
        unit=f.unit,
        expected=f.expected,
        hint=f.hint,
        details=tuple(f.details),
    )


def judge_check(cid: str) -> Callable[[Any], Any]:
    """The check function for one id: reads ``snapshot.extra["workload"]``, never runs anything."""

    def fn(snapshot: Any) -> Any:
        from hostcheck.registry import errored

        g = (getattr(snapshot, "extra", None) or {}).get(GATHERER)
        if not isinstance(g, WorkloadGathered):
            return errored(
                f"the workload run did not complete: {g}",
                hint="run `python -m hostcheck.workload` for the probes' own output",
            )
        return to_outcome(g.finding(cid))

    fn.__name__ = "workload_" + cid.split(".", 1)[1]
    fn.__doc__ = f"{cid}: judged from the workload gatherer's run."
    return fn


def register_all() -> None:
    """Register the gatherer and every workload check with the core (call once, at import)."""
    from hostcheck.gather import register_gatherer
    from hostcheck.registry import REGISTRY, check

    if CHECKS[0][0] in REGISTRY:
        return
    register_gatherer(GATHERER, gather_for_hostcheck, timeout_s=gather_limit)
    for cid, title, weight in CHECKS:
        check(cid, title, weight=weight, needs=(GATHERER, "nvml"))(judge_check(cid))
