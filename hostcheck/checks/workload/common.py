"""What every workload check shares: the registration wrapper, the suite's sections, the GPUs' link facts.

A workload check is an ordinary registered check of ``snapshot.workload`` (the gatherer's WorkloadRun, or an
Unavailable when the gatherer itself failed) and ``snapshot.nvml`` (PCIe and NVLink facts per GPU). The
wrapper says ERROR for a run that never completed and SKIP for a section that was not selected, so each
judging function sees a run it can judge.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from hostcheck.gather.base import BUSY, Unavailable
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Outcome, Status, check, errored, skipped, worst

#: A workload check's body: (run, the GPUs from NVML, whether the suite saw a CUDA GPU) -> Outcome.
WorkloadFn = Callable[[WorkloadRun, list, bool], Outcome]

_HINT_NO_TORCH = (
    "the training Python cannot import torch (or PIL): install them in the training venv "
    "(role gpunode_pytorch) or point --python at the right interpreter"
)


def _f(status: Status, message: str, **kw: Any) -> Outcome:
    return Outcome(Status(status), message, **kw)


def num(v: Any) -> float | None:
    """A finite number from a probe record, else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def link_int(gpu: Any, name: str) -> int | None:
    """An integer NVML field of a GpuInfo (None for a missing GPU or an Unavailable value)."""
    v = getattr(gpu, name, None) if gpu is not None else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def gpu_for(gpus: list, index: Any) -> Any:
    """The NVML GpuInfo with this index (NVML and the suite both count in PCI bus order), or None."""
    return next((g for g in gpus if g.index == index), None)


def verdict_or_skip(statuses: list[Status | None]) -> Status:
    """The worst of the statuses judged (None: nothing to judge); skip when there is none."""
    return worst(s for s in statuses if s is not None)


def workload_check(
    cid: str, title: str, weight: float, section: str | None = None, reads_config: bool = False
) -> Callable[[WorkloadFn], WorkloadFn]:
    """Register ``fn(run, gpus, on_gpu) -> Outcome`` as check ``cid`` over the snapshot's workload run;
    with ``reads_config``, ``fn(run, gpus, on_gpu, config)`` (a site's GPU model figures and [thresholds] live there)."""

    def deco(fn: WorkloadFn) -> WorkloadFn:
        @check(cid, title, weight=weight, needs=("workload", "nvml"))
        def judged(s: Any) -> Outcome:
            run = s.workload
            if isinstance(run, Unavailable) and run.kind == BUSY:
                return skipped(
                    f"not run: {run.reason}",
                    hint="the GPU workload runs only on an idle node: run it between jobs "
                    "(`hostcheck check --only workload`) or in a job of its own",
                )
            if not isinstance(run, WorkloadRun):
                return errored(
                    f"the workload run did not complete: {run}",
                    hint="re-run `hostcheck check --only workload`; a run cut off at its ceiling follows "
                    "--workload-timeout and --rdzv-timeout",
                )
            if section is not None and section not in run.sections:
                return skipped(f"not run: section {section} not selected")
            env_err = run.env.error
            gpus = list(s.nvml.gpus) if s.nvml is not None else []
            on_gpu = run.env.cuda_available
            out = fn(run, gpus, on_gpu, s.options.config) if reads_config else fn(run, gpus, on_gpu)
            if out.status is not Status.ERROR or not env_err:
                return out
            if "No module named" in env_err:
                out = replace(out, hint=out.hint or _HINT_NO_TORCH)
            tail = run.suite.stderr_tail if run.suite is not None and run.suite.error else ""
            if tail:
                out = replace(out, details=(*out.details, *tail.splitlines()[-5:]))
            return out

        judged.__name__ = judged.__qualname__ = fn.__name__
        judged.__doc__ = fn.__doc__
        return fn

    return deco
