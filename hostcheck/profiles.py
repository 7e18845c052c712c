"""Profiles: which checks a run makes and the hard deadline it must end by.

A fleet runs hostcheck in different places: Slurm's HealthCheckProgram every few minutes while jobs run
(``passive``: reads only; slurmd kills a health check that runs past 60 s, slurm.conf(5)), a job's prolog and
epilog (short; Slurm drains the node when the prolog fails), after provisioning (``full``) and on new or
repaired hardware (``burnin``). A check that overruns the deadline is cut off as an error, never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What the read-only gatherers read: NVML, the kernel log, /proc and /sys, files, local facts ("hardware" also
#: keeps its counters in the small state file).
PASSIVE_NEEDS = frozenset({"facts", "system", "nvml", "tuning", "hardware"})


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

    def allows(self, check_needs: frozenset[str]) -> bool:
        return check_needs <= self.needs


#: datapath reads the dataset directories for a few seconds: not in the read-only profiles.
ALL_NEEDS = PASSIVE_NEEDS | {"torch", "workload", "datapath"}

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
            "epilog",
            30.0,
            PASSIVE_NEEDS,
            summary="what a job may leave broken (XIDs, row remaps, stray GPU processes): reads only",
        ),
        Profile(
            "prolog",
            120.0,
            PASSIVE_NEEDS | {"torch"},
            summary="passive plus the training Python's torch probe; no GPU job",
        ),
        Profile("full", 1800.0, ALL_NEEDS, summary="every check, with the short GPU/AMP/DDP workload"),
        Profile(
            "burnin",
            3600.0,
            ALL_NEEDS,
            burn_s=600.0,
            summary="every check plus a 10-minute matmul stress run: new or repaired hardware",
        ),
    )
}
DEFAULT_PROFILE = "full"
