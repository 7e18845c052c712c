"""Workload checks (issue 4): a short real PyTorch GPU / AMP / DDP workload judged against what the GPU can
achieve. Self-contained: the probes run in child processes of the training Python (``probes.py``, stdlib +
torch + PIL only); everything here is standard library. See docs/workload.md.
"""

from hostcheck.workload.api import (
    CHECKS,
    GpuLink,
    MultiNode,
    WorkloadFinding,
    WorkloadRun,
    gather_workload,
    gpus_from_nvml,
    judge_workload,
    run_workload,
    section,
)

__all__ = [
    "CHECKS",
    "GpuLink",
    "MultiNode",
    "WorkloadFinding",
    "WorkloadRun",
    "gather_workload",
    "gpus_from_nvml",
    "judge_workload",
    "run_workload",
    "section",
]
