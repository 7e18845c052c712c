"""NVLink per link through the real NVML (marker ``gpu``; skipped without a GPU and nvidia-ml-py).

Run on a GPU node: ``pytest -m gpu tests/gpu -q``. Whatever the board (SXM with NVSwitches, PCIe without NVLink, a
VM), the gatherer answers every link with a value or a reason and the NVLink checks judge it without an error.
"""

from __future__ import annotations

import pytest

pynvml = pytest.importorskip("pynvml")

from hostcheck.checks import all_checks  # noqa: E402
from hostcheck.core import evaluate  # noqa: E402
from hostcheck.gather import Options, gather  # noqa: E402
from hostcheck.gather.base import Unavailable  # noqa: E402
from hostcheck.gather.nvml import gather_nvml, nvlink_counters  # noqa: E402
from hostcheck.registry import Status  # noqa: E402


def _has_gpu() -> bool:
    snap = gather_nvml(fallback=None)
    return snap.ok and bool(snap.gpus)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU and its driver"),
]


def test_every_link_is_a_value_or_a_reason():
    snap = gather_nvml(fallback=None)
    for g in snap.gpus:
        assert isinstance(g.nvlinks, (tuple, Unavailable)), g
        for i, lk in enumerate(g.nvlinks if isinstance(g.nvlinks, tuple) else ()):
            assert lk.link == i and lk.active in (True, False)
            assert isinstance(lk.speed_mbps, Unavailable) or 0 <= lk.speed_mbps <= 1_000_000
            assert all(v >= 0 for v in lk.counters().values())
        if isinstance(g.nvlinks, tuple):
            assert g.nvlink_active == sum(lk.active is True for lk in g.nvlinks)
    assert all(v >= 0 for v in nvlink_counters(snap.gpus).values())


def test_the_nvlink_checks_judge_the_real_board_without_an_error(tmp_path):
    snap = gather(Options(state_file=str(tmp_path / "state.json")), {"nvml", "system", "hardware"})
    results, _ = evaluate(snap, [c for c in all_checks() if c.category == "nvlink"])
    for r in results:
        assert r.status is not Status.ERROR, r
