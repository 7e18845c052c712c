"""Peers: a GPU, or a node, against the others of its kind. Pure functions, tested from plain numbers.

A GPU can clear its SKU's line and still be the one that holds a synchronous job back: every step waits for
the slowest rank. DCGM (from 4.5) compares each GPU's clocks and board power with the mean of the GPUs under
test and fails one more than ``clocks_tolerance_pcnt`` / ``power_tolerance_pcnt`` below it (``gflops_tolerance_pcnt``
for throughput; NVIDIA/DCGM nvvs/plugin_src/diagnostic); Hugging Face's gpu-fryer fails a GPU whose TFLOP/s are
more than ``--tflops-tolerance`` (default 10%) below the best GPU's. hostcheck compares each figure with the
median of the *other* GPUs (one slow GPU cannot drag its own reference down, and a median ignores a second
outlier), with the tolerance of ``[thresholds]`` (``gpu_peer_tolerance``; ``fleet_peer_tolerance`` for nodes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

K = TypeVar("K")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def peer_ratios(values: Mapping[K, float]) -> dict[K, float]:
    """Each member's figure over the median of the others' (1.0: like its peers). Members without a positive
    finite figure are left out, and so is everyone when fewer than two remain: one GPU has no peers."""
    good = {k: float(v) for k, v in values.items() if _finite(v)}
    if len(good) < 2:
        return {}
    out = {}
    for k, v in good.items():
        others = [x for j, x in good.items() if j != k]
        out[k] = v / _median(others)
    return out


def _median(xs: list[float]) -> float:
    # statistics.median's import (fractions, decimal) is a twentieth of a passive run, which judges no peers.
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def below_peers(values: Mapping[K, float], tolerance: float) -> dict[K, float]:
    """The members more than ``tolerance`` (0.10 = 10%) below the median of the others, with their ratio."""
    return {k: r for k, r in peer_ratios(values).items() if r < 1.0 - tolerance}


def peer_detail(value: float, ratio: float, unit: str, tolerance: float) -> str:
    """What a report says of a member below its peers: how far below, and the peers' median."""
    median = value / ratio
    return f"{ratio:.0%} of its peers' median {median:.4g} {unit} (more than {tolerance:.0%} below)"
