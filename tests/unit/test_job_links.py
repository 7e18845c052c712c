"""hostcheck job and the fabric: NVLink error counters (through the fake NVML) and RDMA port counters (a sysfs tree
under a host root) read at the job's start and end; a communication-bound verdict names the links and ports
whose counters moved, and names none when nothing moved."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fixtures import hostcheck_scenarios as S
from test_job_verdict import analysis

from hostcheck.gather.nvml import NvmlSampler
from hostcheck.job.analyse import analyse
from hostcheck.job.diagnosis import diagnose
from hostcheck.job.links import links_moved, moved, ports_moved, read_rdma_counters
from hostcheck.job.observe import observe
from hostcheck.job.records import read_run
from hostcheck.job.render import render_text

UUID3 = "GPU-00000000-0000-0000-0000-000000000003"


def ib_tree(root: Path, symbol_errors: int = 0) -> Path:
    """Two ConnectX ports, as the kernel's sysfs ABI lays them out (Documentation/ABI/stable/sysfs-class-infiniband)."""
    for dev in ("mlx5_0", "mlx5_1"):
        counters = root / "sys" / "class" / "infiniband" / dev / "ports" / "1" / "counters"
        counters.mkdir(parents=True, exist_ok=True)
        for name in ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery"):
            (counters / name).write_text(f"{symbol_errors if name == 'symbol_error' else 0}\n")
    return root / "sys" / "class" / "infiniband" / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error"


def test_the_port_counters_are_read_through_the_bounded_reader(tmp_path):
    ib_tree(tmp_path)
    got = read_rdma_counters(str(tmp_path))
    assert got["mlx5_0/1/symbol_error"] == 0 and len(got) == 8
    fifo = tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_discards"
    os.mkfifo(fifo)  # someone's FIFO where a counter should be: never opened, never a hang
    t = time.monotonic()
    assert "mlx5_0/1/port_xmit_discards" not in read_rdma_counters(str(tmp_path))
    assert time.monotonic() - t < 5
    assert read_rdma_counters(str(tmp_path / "none")) == {}


def test_moved_names_only_what_rose():
    before = {f"{UUID3}.7.replay": 2, f"{UUID3}.7.crc_flit": 0, f"{UUID3}.8.replay": 9, "gone": 1}
    after = {f"{UUID3}.7.replay": 14, f"{UUID3}.7.crc_flit": 3, f"{UUID3}.8.replay": 1}
    assert moved(before, after) == {
        f"{UUID3}.7.crc_flit": 3,
        f"{UUID3}.7.replay": 12,
    }  # 8: a reset, not a rise
    assert links_moved(before, after, {UUID3: 3}) == [f"GPU 3 ({UUID3}) link 7: +3 crc_flit, +12 replay"]
    assert links_moved(before, before) == []
    assert ports_moved({"mlx5_1/1/symbol_error": 0}, {"mlx5_1/1/symbol_error": 7}) == [
        "mlx5_1 port 1: +7 symbol_error"
    ]


class BumpedNvml(S.FakeNvml):
    """The healthy board, whose GPU 3 link 7 replay counter is whatever the job wrote into ``bump`` (0 before)."""

    def __init__(self, bump: Path):
        super().__init__()
        self.bump = bump

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        if (h, link, counter) == (3, 7, 0) and self.bump.exists():
            return int(self.bump.read_text() or 0)
        return super().nvmlDeviceGetNvLinkErrorCounter(h, link, counter)


def watch(tmp_path: Path, script: str):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    obs = observe(
        [sys.executable, "-c", script],
        str(run_dir),
        interval=0.2,
        nvml_factory=lambda: NvmlSampler(nvml=BumpedNvml(tmp_path / "bump")),
        env={**os.environ},
        host_root=str(tmp_path),
    )
    return analyse(obs, read_run(str(run_dir)))


def test_a_job_that_moved_a_link_and_a_port_has_them_named(tmp_path):
    port = ib_tree(tmp_path, symbol_errors=2)
    script = f"import time; time.sleep(0.8); open({str(tmp_path / 'bump')!r}, 'w').write('5'); "
    script += f"open({str(port)!r}, 'w').write('9\\n'); time.sleep(0.5)"
    a = watch(tmp_path, script)
    assert a.comm["links_moved"] == [f"GPU 3 ({UUID3}) link 7: +5 replay"]
    assert a.comm["ports_moved"] == ["mlx5_1 port 1: +7 symbol_error"]


def test_a_job_that_moved_nothing_names_nothing(tmp_path):
    ib_tree(tmp_path)
    a = watch(tmp_path, "import time; time.sleep(0.6)")
    assert a.comm["links_moved"] == [] and a.comm["ports_moved"] == []


def test_without_rdma_ports_or_nvlink_the_job_says_not_read(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    obs = observe(
        [sys.executable, "-c", "pass"],
        str(run_dir),
        interval=0.2,
        env={**os.environ},
        host_root=str(tmp_path),
    )
    a = analyse(obs, read_run(str(run_dir)))
    assert a.comm["ports_moved"] is None


COMM = {"share": 0.25, "ddp": [{"pid": 100, "exposed_ms": 12.0}], "collectives_s": 0.0}


def test_a_communication_bound_verdict_names_the_links_and_ports_that_moved():
    moved_ = {
        "links_moved": [f"GPU 3 ({UUID3}) link 7: +5 replay"],
        "ports_moved": ["mlx5_1 port 1: +7 symbol_error"],
    }
    v = diagnose(analysis(gpu_util=60.0, comm={**COMM, **moved_}))
    assert v.kind == "communication-bound" and [c.id for c in v.causes] == [
        "ddp-communication",
        "link-errors",
    ]
    ev = v.causes[1].evidence
    assert f"NVLink GPU 3 ({UUID3}) link 7: +5 replay" in ev and "RDMA mlx5_1 port 1: +7 symbol_error" in ev
    text = render_text(analysis(gpu_util=60.0, comm={**COMM, **moved_}), v)
    assert "link 7: +5 replay" in text


def test_nothing_moved_or_not_read_adds_no_cause():
    for extra in ({"links_moved": [], "ports_moved": []}, {"links_moved": None, "ports_moved": None}, {}):
        v = diagnose(analysis(gpu_util=60.0, comm={**COMM, **extra}))
        assert [c.id for c in v.causes] == ["ddp-communication"]
