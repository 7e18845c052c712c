"""Profiles: which checks a run makes and the hard deadline it must end by.

A fleet runs hostcheck in different places: Slurm's HealthCheckProgram every few minutes while jobs run
(``passive``: reads only; slurmd kills a health check that runs past 60 s, slurm.conf(5)), a job's prolog and
epilog (short; Slurm drains the node when the prolog fails), a person at the node (``standard``, the default:
bounded at a minute, no GPU job), after provisioning (``full``: the GPU workload and DCGM's two-minute
diagnostic) and on new or repaired hardware (``burnin``). A check that overruns the deadline is cut off as an
error, never a hang. What each step costs and how it grows with the GPUs: docs/hostcheck.md, "Profiles".
"""

from __future__ import annotations

from dataclasses import dataclass

#: What the read-only gatherers read: NVML, the kernel log, /proc and /sys, files, local facts ("hardware"
#: and "rdma" keep their counters in the small state file; "inventory" reads what the node has, for the baseline
#: checks). "dcgm" runs ``dcgmi diag`` only at the profile's ``dcgm_level``; at level 0 (passive) it only reads
#: the host engine's health watches.
PASSIVE_NEEDS = frozenset({"facts", "system", "nvml", "tuning", "hardware", "rdma", "inventory", "dcgm"})

#: DCGM's diagnostic levels (``dcgmi diag -r N``) and their run time as DCGM documents it (dcgmi diag's reference,
#: https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html: "1 Quick
#: deployment checks, normally lasting seconds; 2 Medium validation, normally lasting approximately two minutes;
#: 3 Long hardware diagnostics, normally lasting approximately 15 minutes; 4 Extended, longer-running"). Level 4
#: has no documented length: no profile chooses it. 0: no diagnostic, the health watches only.
DCGM_LEVEL_RUN_TIME = {
    0: "none: health watches only",
    1: "seconds",
    2: "about 2 minutes",
    3: "about 15 minutes",
}


@dataclass(frozen=True)
class Profile:
    name: str
    #: The whole run, gathering and judging, ends by then (seconds).
    deadline_s: float
    #: Gatherers this profile may start; a check needing another one is left out of the run.
    needs: frozenset[str]
    #: Seconds of matmul stress added to the workload (``--burn``), unless the command line says otherwise.
    burn_s: float = 0.0
    summary: str = ""
    #: Seconds one GPU line (the all_reduce sweep, one matmul dtype, one copy kind) may measure for; the message
    #: and matrix sizes follow from it (workload_args). 0: the profile runs no GPU job.
    gpu_line_s: float = 0.0
    #: ``dcgmi diag -r`` level this profile runs where DCGM is installed (DCGM_LEVEL_RUN_TIME): the longest whose
    #: documented run time fits well inside the deadline. 0: none (the health watches only).
    dcgm_level: int = 0

    def allows(self, check_needs: frozenset[str]) -> bool:
        return check_needs <= self.needs


#: datapath reads the dataset directories for a few seconds: not in the read-only profiles.
ALL_NEEDS = PASSIVE_NEEDS | {"torch", "workload", "datapath"}

#: The one list of profile names (config.py, the command line and the report schema follow it), in the order of
#: the time they take: passive, prolog, epilog, standard, full, burnin.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "passive",
            30.0,
            PASSIVE_NEEDS,
            summary="reads only (NVML, kernel log, files): no torch, no GPU job; for HealthCheckProgram",
        ),
        Profile(
            "prolog",
            120.0,
            PASSIVE_NEEDS | {"torch"},
            summary="passive plus the training Python's torch probe; no GPU job",
            dcgm_level=1,
        ),
        Profile(
            "epilog",
            30.0,
            PASSIVE_NEEDS,
            summary="what a job may leave broken (XIDs, row remaps, stray GPU processes): reads only, and DCGM level 1",
            # 30 s holds level 1 (seconds), not level 2 (about 2 minutes).
            dcgm_level=1,
        ),
        Profile(
            "standard",
            60.0,
            PASSIVE_NEEDS | {"torch", "datapath"},
            summary="the default: every read-only check, the training Python's torch probe, the dataset reads and "
            "DCGM level 1; no GPU job",
            # Level 1 is "seconds"; level 2's two minutes would not fit the minute this profile promises.
            dcgm_level=1,
        ),
        Profile(
            "full",
            1800.0,
            ALL_NEEDS,
            summary="every check, with the GPU/AMP/DDP workload and DCGM's level-2 diagnostic (minutes)",
            gpu_line_s=4.0,
            dcgm_level=2,
        ),
        Profile(
            "burnin",
            3600.0,
            ALL_NEEDS,
            burn_s=600.0,
            summary="every check plus a 10-minute matmul stress run: new or repaired hardware",
            gpu_line_s=15.0,
            dcgm_level=3,
        ),
    )
}
#: What ``hostcheck`` runs when no profile is named: bounded (60 s), so that a first run answers in a minute. The
#: GPU workload and DCGM's level-2 diagnostic run only when ``full`` (or ``burnin``) is named.
DEFAULT_PROFILE = "standard"

GIB = 1 << 30
#: The largest all_reduce message: Azure's per-SKU lines are set at 16 GiB (gpu_skus.json, allreduce).
ALLREDUCE_MAX_BYTES = 16 * GIB
#: The matmul size the reference figures were measured at (gpu_skus.json: 8192^3; 4096^3 reads 2% lower).
MATMUL_PLATEAU_N = 8192


def workload_args(profile: Profile) -> dict[str, dict]:
    """Per-section probe arguments from the profile's time budget (``gpu_line_s``), below any the command line
    gives (``--workload-section-args`` wins key by key).

    - ddp: the all_reduce message doubles from 64 MiB while the next size's timed operations fit in the budget,
      up to 16 GiB: with the full profile's 4 s an 8 x H100 node (about 60 ms per 16 GiB operation) reaches
      16 GiB, the size its line is set at; a slower interconnect stops earlier and is told so.
    - matmul: each dtype measures for an eighth of the budget (at most 1 s) at n = 8192 on a GPU, the size the
      reference figures were measured at, once the budget holds a few dozen batches of it (from 1 s).
    - bandwidth: each copy kind measures for a sixteenth of the budget (at most 1 s).
    An 8-GPU node runs these per GPU, so the shares stay small: the suite's own limit (--workload-timeout) holds.
    """
    b = profile.gpu_line_s
    if b <= 0:
        return {}
    return {
        "ddp": {"bw_budget_s": b, "bw_max_bytes": ALLREDUCE_MAX_BYTES},
        "matmul": {"gpu_n": MATMUL_PLATEAU_N if b >= 1.0 else 4096, "measure_s": round(min(1.0, b / 8), 3)},
        "bandwidth": {"measure_s": round(min(1.0, b / 16), 3)},
    }


def merge_section_args(base: dict[str, dict], given: dict[str, dict] | None) -> dict[str, dict]:
    """``base`` with ``given`` laid over it, section by section and key by key."""
    out = {k: dict(v) for k, v in base.items()}
    for section, values in (given or {}).items():
        out.setdefault(section, {}).update(values)
    return out
