"""How long the rest of a bench run will take, from what its own runs took on this node.

Before anything is measured the only honest figure is none: a run's cost (a few training steps or a DataLoader
epoch) differs a hundredfold between a 2-core VM and a GPU node, and a constant guessed for one (1.3 s a run, the
old estimate) misled the other by a factor of four. So the estimate is made from measured costs: each group's
worker start-up (from the group's start to its first answer, less that answer's own run) and each run's wall time,
per workload. A group not started yet is costed at its workload's measured runs (any workload's, until its own is
measured) and the start-ups measured so far.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Eta:
    """Fed by the bench as it goes (:meth:`group_started`, :meth:`run_done`); :meth:`left_s` is the estimate."""

    #: (group key, workload, runs planned) in the order the groups run.
    groups: list[tuple[str, str, int]]
    clock: Callable[[], float] = time.monotonic
    started: dict[str, float] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    #: Wall seconds of each measured run, per workload.
    runs_s: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds from each group's start to its first run's start: its worker processes' start-up.
    startup_s: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, plan: Any, pairs: int, warmup: int, clock: Callable[[], float] = time.monotonic) -> Eta:
        groups = [(g.key, g.workload, len(g.variants) * (pairs + warmup)) for g in plan.groups]
        return cls(groups, clock)

    def group_started(self, key: str) -> None:
        self.started[key] = self.clock()

    def run_done(self, key: str, workload: str, wall_s: float) -> None:
        if self.done.get(key, 0) == 0 and key in self.started:
            self.startup_s.append(max(0.0, self.clock() - self.started[key] - wall_s))
        self.done[key] = self.done.get(key, 0) + 1
        self.runs_s.setdefault(workload, []).append(wall_s)

    def measured(self) -> bool:
        return bool(self.runs_s)

    def run_cost(self, workload: str) -> float | None:
        """A run of ``workload``: the median of its measured runs, else of every measured run."""
        own = self.runs_s.get(workload)
        every = [x for xs in self.runs_s.values() for x in xs]
        return statistics.median(own or every) if (own or every) else None

    def left_s(self) -> float | None:
        """Seconds the planned runs not done yet will take; None before the first run is measured."""
        if not self.measured():
            return None
        startup = statistics.median(self.startup_s) if self.startup_s else 0.0
        left = 0.0
        for key, workload, runs in self.groups:
            n = runs - self.done.get(key, 0)
            if n <= 0:
                continue
            left += n * (self.run_cost(workload) or 0.0)
            if key not in self.started:
                left += startup
        return left
