"""The GPU side of hostcheck job without a GPU: NvmlSampler on a fake nvidia-ml-py, and an observed command whose
GPU figures come from it all the way to the verdict, the JSON and the picture's green line."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from hostcheck.gather.nvml import NvmlSampler
from hostcheck.job import png
from hostcheck.job.analyse import analyse
from hostcheck.job.diagnosis import diagnose
from hostcheck.job.observe import observe
from hostcheck.job.records import read_run


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
    v = diagnose(a)
    assert v.kind == "idle-gpu" and v.causes[0].id == "job-not-on-gpu"  # NVML listed no process of the job's
    data = png.draw_timeline(a.timeline, "hostcheck job: idle-gpu", "sleep")
    from io import BytesIO

    from PIL import Image

    with Image.open(BytesIO(data)) as im:
        assert png.GREEN in {
            im.getpixel((x, y)) for x in range(70, png.WIDTH - 24) for y in range(80, 290, 2)
        }


class _Metric:
    """nvmlGpmMetric_t: metricId in; nvmlReturn and value out (NVML API reference, GPM Structs)."""

    def __init__(self) -> None:
        self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0


class _MetricsGet:
    """nvmlGpmMetricsGet_t: version, numMetrics, sample1, sample2, metrics[NVML_GPM_METRIC_MAX]."""

    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [_Metric() for _ in range(98)]


class FakeGpmNvml(FakeNvml):
    """FakeNvml with NVML's GPM API as its reference describes it (nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc,
    nvmlGpmSampleGet, nvmlGpmMetricsGet, nvmlGpmSampleFree): GPU 0 is a Hopper that supports GPM, GPU 1 an older
    GPU that does not (isSupportedDevice 0). Its SMs are ``sm``% active at ``occ``% occupancy, while NVML's
    utilisation reads ``util`` (any kernel running)."""

    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = 2, 3
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(self, util: int = 100, sm: float = 38.0, occ: float = 21.0, fail_occ: bool = False) -> None:
        super().__init__(util=util)
        self.sm, self.occ, self.fail_occ = sm, occ, fail_occ
        self.allocated, self.freed, self.got = 0, 0, []

    def nvmlGpmQueryDeviceSupport(self, h: int):
        return SimpleNamespace(version=1, isSupportedDevice=int(h == 0))

    def nvmlGpmSampleAlloc(self):
        self.allocated += 1
        return SimpleNamespace(n=self.allocated, gpu=None)

    def nvmlGpmSampleFree(self, sample) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, h: int, sample) -> None:
        if h != 0:
            raise NVMLError(3)
        sample.gpu = h

    def nvmlGpmMetricsGet(self, get) -> None:
        assert get.version == 1 and get.numMetrics == 2 and get.sample1 is not get.sample2
        assert get.sample1.gpu == get.sample2.gpu == 0
        self.got.append((get.sample1.n, get.sample2.n))
        values = {2: self.sm, 3: self.occ}
        for m in get.metrics[: get.numMetrics]:
            m.value = values[m.metricId]
            if m.metricId == 3 and self.fail_occ:
                m.nvmlReturn, m.value = 3, float("nan")


def test_gpm_gives_sm_activity_and_occupancy_from_the_second_sample_on_gpus_that_have_it():
    nv = FakeGpmNvml()
    s = NvmlSampler(nvml=nv)
    first = s.sample(pcie=False)
    assert [(g.sm_active_pct, g.sm_occupancy_pct) for g in first] == [(None, None), (None, None)]
    second, third = s.sample(pcie=False), s.sample(pcie=False)
    assert (second[0].sm_active_pct, second[0].sm_occupancy_pct) == (38.0, 21.0)
    assert second[1].sm_active_pct is None and second[1].util_pct == 100  # no GPM: utilisation only
    assert third[0].sm_active_pct == 38.0
    assert nv.got == [(1, 2), (2, 1)]  # two buffers, used in turn: the newer sample against the one before
    s.close()
    assert nv.allocated == nv.freed == 2 and nv.shut


def test_a_gpm_metric_with_an_error_of_its_own_is_none_and_the_others_stand():
    s = NvmlSampler(nvml=FakeGpmNvml(fail_occ=True))
    s.sample(pcie=False)
    g = s.sample(pcie=False)[0]
    assert (g.sm_active_pct, g.sm_occupancy_pct) == (38.0, None)


def test_a_nvml_without_gpm_functions_samples_as_before():
    g = NvmlSampler(nvml=FakeNvml(util=37)).sample(pcie=False)
    assert [x.sm_active_pct for x in g] == [None, None] and g[0].util_pct == 37


def test_sm_activity_not_utilisation_judges_the_job_and_every_output_says_which(tmp_path):
    """NVML utilisation 100% (a kernel always running) with the SMs 38% active: the job was called compute-bound
    on utilisation; on SM activity it is not, and the text, the JSON and the picture name the signal."""
    from hostcheck.job.render import render_text, report_dict

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fake = FakeGpmNvml(util=100, sm=38.0)

    def only_gpu0() -> NvmlSampler:
        fake.nvmlDeviceGetCount = lambda: 1
        return NvmlSampler(nvml=fake)

    obs = observe(
        [sys.executable, "-c", "import time; time.sleep(1.5)"],
        str(run_dir),
        interval=0.2,
        nvml_factory=only_gpu0,
        env={**os.environ},
    )
    a = analyse(obs, read_run(str(run_dir)))
    assert a.gpu_signal == "sm-activity (NVML GPM)" and a.gpu_util == 38.0
    assert a.gpus[0]["util_mean"] == 100.0 and a.gpus[0]["sm_occupancy_mean"] == 21.0
    v = diagnose(a)
    assert v.kind == "idle-gpu" and "GPU SM activity 38% (NVML GPM)" in v.headline
    text = render_text(a, v)
    assert "judged by sm-activity (NVML GPM)" in text
    assert (
        "SM activity 38%, SM occupancy 21% (NVML GPM), utilisation 100% (kernel time, not SM activity)"
        in text
    )
    doc = report_dict(a, v)
    assert doc["gpu_signal"] == doc["timeline"]["gpu_signal"] == "sm-activity (NVML GPM)"
    assert {p for _t, p in doc["timeline"]["gpu"]} == {38.0}
    assert png._gpu_label(doc["timeline"]["gpu_signal"]) == "GPU SM activity % (NVML GPM)"
    assert png._gpu_label("utilisation") == "GPU utilisation % (kernel time, not SM activity)"
