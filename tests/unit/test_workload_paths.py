"""workload.E016, GPU-to-GPU copy bandwidth for every pair: the records the p2p probe writes, judged through the
registered check with each fault planted and absent, and the probe's code on the CPU."""

from __future__ import annotations

import json
import os

import pytest
from workload_runs import judge_one, pairs_record

from hostcheck.checks.workload import sku as S
from hostcheck.child.launch import ProbeRun
from hostcheck.gather.rdma import parse_rate
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Status

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"
NVLINK = {"nvlink_active": 18}


def run_of(p2p: dict, name: str = H100, n: int = 8) -> WorkloadRun:
    env = {"cuda_available": True, "gpus": [{"index": i, "name": name} for i in range(n)]}
    recs = []
    for section, data in (("env", env), ("p2p", p2p)):
        recs += [{"probe": section, "event": "start"}, {"probe": section, "ok": True, "data": data}]
    return WorkloadRun(suite=ProbeRun(name="suite", records=tuple(recs)), sections=("env", "p2p"))


def gpus(n: int = 8, name: str = H100, **kw) -> list[dict]:
    return [dict(index=i, name=name, **{**NVLINK, **kw}) for i in range(n)]


def judge(record: dict, name: str = H100, n: int = 8, **gpu_kw):
    return judge_one(run_of(record, name, n), "workload.E016", gpus(n, name, **gpu_kw))


def test_the_line_is_azures_public_p2p_figure_per_sku():
    line = S.peer_copy_line(H100)
    assert line is not None and line.gbs == 335.0 and line.warn_band == 1.05 and line.basis == "public"
    assert (
        line.source == "https://github.com/Azure/azurehpc-health-checks/blob/main/conf/nd96isr_h100_v5.conf"
    )
    assert S.peer_copy_line("NVIDIA H200").gbs == 335.0
    # Azure's NC H100 v5 figure (335 on 2 x H100 NVL) is above the 300 GB/s one way an H100 NVL's bridges carry:
    # no line, the pairs are compared with each other only.
    assert S.peer_copy_line("NVIDIA H100 NVL") is None
    assert (
        S.peer_copy_line(L40S) is None and S.peer_copy_line("NVIDIA A100-SXM4-80GB") is None
    )  # never extrapolated


def test_a_healthy_8_gpu_node_passes_with_the_slowest_pair_as_value():
    r = judge(pairs_record())
    assert r.status == Status.PASS and r.value == 372.0 and r.unit == "GB/s"
    assert "56 GPU pairs" in r.message and "335" in r.expected and r.hint is None
    json.dumps(r.to_dict())


def test_a_pair_below_the_line_fails_and_is_named():
    r = judge(pairs_record(**{"3-5": {"gbs": 180.0}}))
    assert r.status == Status.FAIL and r.value == 180.0
    assert "GPU 3 -> GPU 5" in r.message and any("GPU 3 -> GPU 5: 180.0 GB/s" in d for d in r.details)
    assert any("below the line 335" in d for d in r.details) and "nvlink" in r.hint
    assert not any("GPU 5 -> GPU 3" in d for d in r.details)  # the other direction is healthy


def test_a_pair_within_the_warn_band_warns():
    r = judge(pairs_record(gbs=372.0, **{"0-1": {"gbs": 340.0}}))
    assert r.status == Status.WARN and any("within 5% of the line" in d for d in r.details)


def test_peer_access_off_is_said_and_its_slow_copy_fails():
    r = judge(pairs_record(**{"2-6": {"gbs": 21.0, "p2p": False}}))
    assert r.status == Status.FAIL and any("peer access OFF" in d for d in r.details)
    assert "peer access OFF" not in " ".join(judge(pairs_record()).details)


def test_wrong_bytes_fail_and_a_copy_that_raised_is_an_error_never_a_fail():
    assert judge(pairs_record(**{"1-0": {"ok": False}})).status == Status.FAIL
    r = judge(
        pairs_record(**{"4-7": {"error": "RuntimeError: CUDA error: an illegal memory access", "gbs": None}})
    )
    assert r.status == Status.ERROR and any(
        "GPU 4 -> GPU 7: not measured (RuntimeError" in d for d in r.details
    )


def test_without_a_sku_line_or_nvlink_a_slow_pair_only_warns_against_its_peers():
    planted = {"1-3": {"gbs": 20.0}}
    # L40S: no public line, a pair far below the others warns (never fails).
    r = judge(pairs_record(n=4, gbs=25.0, name=L40S, **planted), name=L40S, n=4, nvlink_active=0)
    assert r.status == Status.WARN and "other pairs" in r.expected
    assert any("of its peers' median" in d for d in r.details)
    assert (
        judge(pairs_record(n=4, gbs=25.0, name=L40S), name=L40S, n=4, nvlink_active=0).status == Status.PASS
    )
    # H100 whose NVML shows no active NVLink: the NVLink line does not apply, the peer rule does.
    r = judge(pairs_record(gbs=50.0, **planted), nvlink_active=0)
    assert r.status == Status.WARN


def test_one_gpu_skips_and_a_suite_that_died_is_an_error():
    r = judge({"skipped": "1 CUDA GPU: no pair to measure", "pairs": []}, n=1)
    assert r.status == Status.SKIP and "no pair" in r.message
    died = WorkloadRun(
        suite=ProbeRun(
            name="suite", records=({"probe": "p2p", "event": "start"},), error="timed out after 60 s"
        ),
        sections=("env", "p2p"),
    )
    r = judge_one(died, "workload.E016", gpus())
    assert r.status == Status.ERROR and "during p2p" in r.message
    not_selected = WorkloadRun(suite=ProbeRun(name="suite", records=()), sections=("env",))
    assert judge_one(not_selected, "workload.E016", gpus()).status == Status.SKIP


def test_the_probe_code_on_the_cpu():
    """The pair timing runs on any two torch devices (here the CPU twice: the code path, not a figure); the
    section itself needs two CUDA GPUs and says so without them."""
    torch = pytest.importorskip("torch")
    from hostcheck.inside import workload as probes

    cpu = torch.device("cpu")
    got = probes.pair_rate(torch, cpu, cpu, 1 << 20, 0.01, 0.02)
    assert got["gbs"] > 0 and got["ok"] is True and got["bytes"] == 1 << 20 and got["batches"] >= 3
    out = probes.probe_p2p({"device": "cpu"})
    assert out == {"skipped": "0 CUDA GPUs: no pair to measure", "pairs": []}
    assert "p2p" in probes.SECTIONS


# --- workload.E017: the all_reduce through the NICs --------------------------------------------------------------


def ib_tree(root, ports: dict[str, tuple[str, str]]) -> str:
    """A /sys/class/infiniband tree as the kernel's sysfs ABI describes it (Documentation/ABI/stable/
    sysfs-class-infiniband): ``ports``: "mlx5_0" -> (rate, state) of its port 1."""
    for dev, (rate, state) in ports.items():
        p = root / "sys" / "class" / "infiniband" / dev / "ports" / "1"
        p.mkdir(parents=True)
        (p / "rate").write_text(rate + "\n")
        (p / "state").write_text(state + "\n")
        (p / "link_layer").write_text("InfiniBand\n")
    return str(root)


NDR = ("400 Gb/sec (4X NDR)", "4: ACTIVE")


def test_the_rdma_port_reader_parses_the_sysfs_abi(tmp_path):
    from hostcheck.gather import rdma_rate as R

    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0 and parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert (
        parse_rate("fast") is None and R.parse_state("4: ACTIVE") == "ACTIVE" and R.parse_state("x") is None
    )
    root = ib_tree(
        tmp_path, {f"mlx5_{i}": NDR for i in range(8)} | {"mlx5_8": ("200 Gb/sec (4X HDR)", "1: DOWN")}
    )
    ports = R.gather_rdma_ports(root)
    assert len(ports) == 9 and ports[0] == R.NicPort("mlx5_0", 1, 400.0, "ACTIVE", "InfiniBand")
    assert ports[0].gpu is None  # no PCI path in this tree: paired with no GPU
    assert ports[-1].rate_gbps == 200.0 and ports[-1].state == "DOWN"
    none = R.gather_rdma_ports(str(tmp_path / "empty"))
    assert not isinstance(none, tuple) and "no RDMA device" in str(none)


def loopback_run(busbw: float, ports: tuple[dict, ...], world: int = 8, ok: bool = True, **kw) -> WorkloadRun:
    runs = []
    for r in range(world):
        data = {"rank": r, "world": world, "backend": "nccl", "allreduce_ok": ok, "busbw_gbs": busbw}
        data["bw_bytes"] = 1 << 30
        runs.append(ProbeRun(name=f"ddp[{r}]", records=({"probe": "ddp_worker", "ok": True, "data": data},)))
    return WorkloadRun(nic_loopback=tuple(runs), nic_ports=ports, sections=("nic_loopback",), **kw)


PORTS = tuple({"device": f"mlx5_{i}", "port": 1, "rate_gbps": 400.0, "state": "ACTIVE"} for i in range(8))


def test_the_all_reduce_through_the_nics_is_judged_against_the_slowest_ports_line_rate():
    r = judge_one(loopback_run(45.0, PORTS), "workload.E017", gpus())
    assert (
        r.status == Status.PASS
        and r.value == 45.0
        and "50 GB/s" in r.message
        and "NCCL_P2P_DISABLE=1" in r.message
    )
    # Planted: a slow all_reduce warns (the fraction is hostcheck's own, so never a fail).
    r = judge_one(loopback_run(12.0, PORTS), "workload.E017", gpus())
    assert r.status == Status.WARN and "80% of 50 GB/s" in r.expected and "ibstat" in r.hint
    # A port at 200 Gb/s lowers the line to 25 GB/s: 30 GB/s is above 80% of it.
    slow = (*PORTS[:7], dict(PORTS[7], rate_gbps=200.0))
    r = judge_one(loopback_run(30.0, slow), "workload.E017", gpus())
    assert r.status == Status.PASS and "mlx5_7:1 runs at 200 Gb/s" in r.message


def test_the_nic_all_reduce_skips_with_the_reason_errors_when_it_broke_and_fails_a_wrong_sum():
    no_nic = WorkloadRun(
        nic_loopback_skipped="no active RDMA port (no RDMA device under /sys/class/infiniband)"
    )
    r = judge_one(replace_sections(no_nic), "workload.E017", gpus())
    assert r.status == Status.SKIP and "no RDMA device" in r.message
    assert judge_one(loopback_run(45.0, PORTS, ok=False), "workload.E017", gpus()).status == Status.FAIL
    crashed = loopback_run(45.0, PORTS)
    crashed = WorkloadRun(
        nic_loopback=(
            ProbeRun(name="ddp[0]", error="crashed (exit 1): NCCL error"),
            *crashed.nic_loopback[1:],
        ),
        nic_ports=PORTS,
        sections=("nic_loopback",),
    )
    assert judge_one(crashed, "workload.E017", gpus()).status == Status.ERROR


def replace_sections(run: WorkloadRun) -> WorkloadRun:
    from dataclasses import replace

    return replace(run, sections=("nic_loopback",))


def test_the_gatherer_launches_the_nic_all_reduce_with_p2p_and_shm_off_only_where_nics_are(
    monkeypatch, tmp_path
):
    from hostcheck.gather import rdma_rate as R
    from hostcheck.gather import workload as api

    seen = []
    monkeypatch.setattr(api, "launch_local_ddp", lambda *a: seen.append(a) or ())
    suite = [
        {"probe": "env", "ok": True, "data": {"cuda_available": True, "gpus": [{}, {}]}},
        {"probe": "ddp", "ok": True, "data": {"deferred": True, "gpus": 2}},
    ]
    monkeypatch.setattr(api, "run_child", lambda *a, **k: ProbeRun(name="suite", records=tuple(suite)))
    ports = R.gather_rdma_ports(ib_tree(tmp_path, {"mlx5_0": NDR}))
    run = api.gather_workload(
        "/py", sections=("env", "ddp", "nic_loopback"), nic_ports=ports, gpu_possible=True
    )
    (ddp, loop) = seen
    assert ddp[2] == "nccl" and ddp[5] is None  # the DDP check: the training environment as it is
    assert loop[1:3] == (2, "nccl") and loop[5] == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    assert run.nic_ports == (ports[0].to_dict(),) and not run.nic_loopback_skipped
    seen.clear()
    none = R.gather_rdma_ports(str(tmp_path / "nothing"))
    run = api.gather_workload(
        "/py", sections=("env", "ddp", "nic_loopback"), nic_ports=none, gpu_possible=True
    )
    assert len(seen) == 1 and "no RDMA device" in run.nic_loopback_skipped


# --- workload.E018: GPUDirect RDMA write bandwidth per NIC --------------------------------------------------------

#: ib_write_bw's result table as perftest prints it with --report_gbits (a duration run leaves the peak at 0.00).
IB_WRITE_BW_OUT = """\
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 8388608    29172            0.00               {bw}                 0.005861
---------------------------------------------------------------------------------------
"""


def fake_perftest(tmp_path, bw: str = "391.62") -> str:
    """A PATH holding a numactl that records its binding and runs the rest, and an ib_write_bw whose server
    waits and whose client prints the result table."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    (bin_dir / "numactl").write_text(f'#!/bin/sh\necho "numactl $*" >> {log}\nshift 4\nexec "$@"\n')
    body = IB_WRITE_BW_OUT.format(bw=bw)
    (bin_dir / "ib_write_bw").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do last="$a"; done\n'
        'case "$last" in 127.0.0.1) ;; *) exec sleep 60 ;; esac\n'
        f"cat <<'END'\n{body}END\n"
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return str(bin_dir)


def test_ib_write_bw_runs_per_nic_bound_to_its_numa_node_and_its_result_line_is_read(tmp_path, monkeypatch):
    from hostcheck.gather import gdr_write as G
    from hostcheck.gather.rdma_rate import NicPort

    assert G.parse_bw(IB_WRITE_BW_OUT.format(bw="391.62")) == 391.62 and G.parse_bw("no table") is None
    bin_dir = fake_perftest(tmp_path)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    ports = (
        NicPort("mlx5_0", 1, 400.0, "ACTIVE", "InfiniBand", 0, 0, "0000:18:00.0"),
        NicPort("mlx5_1", 1, 400.0, "ACTIVE", "InfiniBand", 1, 5, "0000:ab:00.0"),
        NicPort("mlx5_2", 1, 100.0, "ACTIVE", "Ethernet", 1, 6, "0000:ba:00.0"),  # RoCE: not this test's
        NicPort("mlx5_3", 1, 400.0, "ACTIVE", "InfiniBand", 1),  # serves no GPU: not measured
    )
    run = G.gather_gdr_write(ports, gpus=8, seconds=1)
    assert [(r["device"], r["gpu"], r["gpu_pci"], r["numa_node"], r["gbps"]) for r in run.rows] == [
        ("mlx5_0", 0, "0000:18:00.0", 0, 391.62),
        ("mlx5_1", 5, "0000:ab:00.0", 1, 391.62),
    ]
    log = (tmp_path / "argv.log").read_text().splitlines()
    client = next(x for x in log if x.endswith("127.0.0.1") and "mlx5_1" in x)
    assert (
        client.startswith("numactl -N 1 -m 1 ib_write_bw -p 18511 -s 8388608 ") and "--use_cuda=5" in client
    )
    assert "-D 1" in client and len(log) == 4  # a server and a client per NIC
    # Without perftest, or without an InfiniBand port, or without a pairing by topology: skipped with the reason.
    assert (
        "ib_write_bw not found (install perftest)"
        in G.gather_gdr_write(ports, 8, which=lambda t: None).skipped
    )
    assert G.gather_gdr_write(ports[2:3], 8, seconds=1).skipped == "no ACTIVE InfiniBand port"
    assert "never matched to NICs by name order" in G.gather_gdr_write(ports[3:], 8, seconds=1).skipped
    # CUDA numbers the GPUs as the pairing does (PCI address order), every GPU visible.
    argv = G.argv_for("mlx5_10", 18510, 6, 1, 5.0, None)
    assert argv[:4] == ["env", "-u", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER=PCI_BUS_ID"]


def test_the_gpudirect_probe_pairs_each_nic_with_its_gpu_by_topology_not_by_name(tmp_path):
    """A DGX H100 (NVIDIA's DGX H100/H200 user guide, "Network Modules"): twelve RDMA devices, so mlx5_10 sorts
    before mlx5_2; mlx5_10 is GPU 6's rail (OSFP2P1), mlx5_3 GPU 1's, and the storage cards serve no GPU."""
    import fabrictree as T

    from hostcheck.gather import rdma_rate as R

    node = T.layout(tmp_path / "host", "dgx_h100")
    ports = R.gather_rdma_ports(str(tmp_path / "host"))
    by = {p.device: (p.gpu, p.gpu_pci) for p in ports}
    gpus = sorted(node.gpus)
    assert {name: gpus.index(g) for g, name in node.rails.items()} == {
        n: by[n][0] for n in node.rails.values()
    }
    assert by["mlx5_10"] == (6, gpus[6]) and by["mlx5_3"] == (1, gpus[1])
    assert by["mlx5_1"] == by["mlx5_2"] == by["mlx5_7"] == by["mlx5_8"] == (None, None)
    # The old pairing (the i-th active port in name order with GPU i) put mlx5_10 on GPU 1 and mlx5_3 on GPU 4.
    names = sorted(p.device for p in ports if p.state == "ACTIVE" and p.link_layer == "InfiniBand")
    assert names.index("mlx5_10") == 1 and by["mlx5_10"][0] != names.index("mlx5_10")


def gdr_run(rows, skipped: str = "") -> WorkloadRun:
    from hostcheck.gather.gdr_write import GdrRun

    return WorkloadRun(gdr_write=GdrRun(rows=tuple(rows), skipped=skipped), sections=("gdr_write",))


def nic_row(i: int, gbps, rate: float = 400.0, **kw) -> dict:
    return {
        "device": f"mlx5_{i}",
        "port": 1,
        "gpu": i,
        "numa_node": i // 4,
        "rate_gbps": rate,
        "gbps": gbps,
        **kw,
    }


def test_gpudirect_write_fails_below_azures_360_on_ndr_and_only_warns_elsewhere():
    healthy = [nic_row(i, 391.6) for i in range(8)]
    r = judge_one(gdr_run(healthy), "workload.E018", gpus())
    assert r.status == Status.PASS and r.value == 391.6 and "360" in r.expected
    # 370 Gb/s clears Azure's ND H200 v5 line (360), the low end of the two published NDR lines: a healthy node
    # outside one cloud's tuning passes where the H100 line (380) failed it.
    assert (
        judge_one(gdr_run([nic_row(i, 370.0) for i in range(8)]), "workload.E018", gpus()).status
        == Status.PASS
    )
    planted = [*healthy[:5], nic_row(5, 201.3), *healthy[6:]]
    r = judge_one(gdr_run(planted), "workload.E018", gpus())
    assert r.status == Status.FAIL and any(
        d.startswith("mlx5_5:1 with GPU 5 (NUMA node 1): 201.3") for d in r.details
    )
    # A 200 Gb/s HDR port has no public line: 150 Gb/s warns (95% of 200 is hostcheck's), never fails.
    r = judge_one(gdr_run([nic_row(0, 150.0, rate=200.0)]), "workload.E018", gpus())
    assert r.status == Status.WARN
    assert judge_one(gdr_run([nic_row(0, 195.0, rate=200.0)]), "workload.E018", gpus()).status == Status.PASS


def test_gpudirect_write_skips_with_the_reason_and_a_broken_run_is_an_error():
    r = judge_one(gdr_run([], skipped="ib_write_bw not found (install perftest)"), "workload.E018", gpus())
    assert r.status == Status.SKIP and "perftest" in r.message
    broken = [nic_row(0, None, error="ib_write_bw exited 1: Couldn't allocate MR with CUDA")]
    r = judge_one(gdr_run(broken), "workload.E018", gpus())
    assert r.status == Status.ERROR and "Couldn't allocate MR" in r.details[0]
    assert judge_one(WorkloadRun(sections=("env",)), "workload.E018", gpus()).status == Status.SKIP


def test_gpudirect_write_counts_only_the_nics_that_wrote():
    """Two NICs that both failed wrote nothing into GPU memory: the message never says they did."""
    failed_both = [nic_row(i, None, error="ib_write_bw exited 1: no route") for i in range(2)]
    r = judge_one(gdr_run(failed_both), "workload.E018", gpus())
    assert r.status == Status.ERROR and r.message == "no NIC wrote into GPU memory (2 NICs not measured)"
    r = judge_one(gdr_run([nic_row(0, 391.6), failed_both[1]]), "workload.E018", gpus())
    assert r.message == "1 NIC wrote into GPU memory; slowest 391.6 Gb/s (1 not measured)", r.message
    r = judge_one(gdr_run([nic_row(0, 391.6), nic_row(1, 390.0)]), "workload.E018", gpus())
    assert r.message == "2 NICs wrote into GPU memory; slowest 390.0 Gb/s", r.message
