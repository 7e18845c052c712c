"""The GPU side of hostcheck job without a GPU: NvmlSampler on a fake nvidia-ml-py, and an observed command whose
GPU figures come from it all the way to the verdict, the JSON and the picture's green line."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from hostcheck.gather.nvml import NvmlSampler
from hostcheck.job import png
from hostcheck.job.analyse import analyse
from hostcheck.job.observe import observe
from hostcheck.job.records import read_run
from hostcheck.job.verdict import judge


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class FakeNvml:
    """Two GPUs: GPU 0 answers everything, GPU 1 has no PCIe counters (NotSupported)."""

    def __init__(self, util: int = 37) -> None:
        self.util = util
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int):
        return SimpleNamespace(gpu=self.util, memory=12)

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return SimpleNamespace(used=3 << 30, total=80 << 30)

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        if h == 1:
            raise NVMLError(3)
        return 1000 * (counter + 1)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 250_000

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetComputeRunningProcesses(self, h: int):
        return [SimpleNamespace(pid=4242)] if h == 0 else []


def test_the_sampler_reads_every_figure_and_keeps_what_a_gpu_does_not_answer_as_none():
    nv = FakeNvml()
    s = NvmlSampler(nvml=nv)
    g0, g1 = s.sample(pcie=True)
    assert (g0.util_pct, g0.mem_used_bytes, g0.power_w, g0.sm_clock_mhz) == (37, 3 << 30, 250.0, 1980)
    assert (g0.pcie_tx_kbs, g0.pcie_rx_kbs) == (1000, 2000) and g1.pcie_tx_kbs is None
    assert s.sample(pcie=False)[0].pcie_tx_kbs is None
    assert s.processes() == {0: (4242,), 1: ()}
    s.close()
    assert nv.shut


def test_without_nvidia_ml_py_the_sampler_says_why_and_samples_nothing():
    def missing():
        raise ImportError("No module named 'pynvml'")

    s = NvmlSampler(loader=missing)
    assert "nvidia-ml-py" in s.error.reason and s.sample() == () and s.processes() == {}


def test_gpu_figures_reach_the_verdict_and_the_picture(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    obs = observe(
        [sys.executable, "-c", "import time; time.sleep(1.5)"],
        str(run_dir),
        interval=0.2,
        nvml_factory=lambda: NvmlSampler(nvml=FakeNvml(util=37)),
        env={**os.environ},
    )
    assert obs.exit_code == 0 and obs.gpu_error is None and len(obs.gpu_samples) >= 3
    a = analyse(obs, read_run(str(run_dir)))
    assert [g["util_mean"] for g in a.gpus] == [37.0, 37.0]
    assert a.gpus[0]["pcie_rx_mb_s"] == round(2000 * 1024 / 1e6, 1) and a.gpus[1]["pcie_rx_mb_s"] is None
    v = judge(a)
    assert v.kind == "idle-gpu" and v.causes[0].id == "job-not-on-gpu"  # NVML listed no process of the job's
    data = png.draw_timeline(a.timeline, "hostcheck job: idle-gpu", "sleep")
    from io import BytesIO

    from PIL import Image

    with Image.open(BytesIO(data)) as im:
        assert png.GREEN in {
            im.getpixel((x, y)) for x in range(70, png.WIDTH - 24) for y in range(80, 290, 2)
        }
