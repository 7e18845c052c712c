"""The nvidia-smi fallback (no nvidia-ml-py): CSV parsing and field negotiation, from synthesised output.

The CSV below follows nvidia-smi's --format=csv,noheader,nounits layout; it is written for these tests,
not recorded on a node.
"""

from __future__ import annotations

import dataclasses

import hostcheck_scenarios as S

from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather.base import CmdResult, Unavailable
from hostcheck.gather.nvml import gather_nvml
from hostcheck.gather.smi import GPU_FIELDS, cell, gather_smi, parse_cuda_version
from hostcheck.registry import Status

HEADER = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
"""


def gpu_row(i, bus, width="16", ecc_vol="0", reasons="0x0000000000000001"):
    values = {
        "index": str(i),
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{i:08d}",
        "pci.bus_id": f"00000000:{bus}:00.0",
        "driver_version": "580.159.04",
        "compute_cap": "9.0",
        "memory.total": "81559",
        "ecc.mode.current": "Enabled",
        "ecc.mode.pending": "Enabled",
        "ecc.errors.uncorrected.volatile.total": ecc_vol,
        "ecc.errors.uncorrected.aggregate.total": ecc_vol,
        "retired_pages.single_bit_ecc.count": "[N/A]",
        "retired_pages.double_bit.count": "[N/A]",
        "retired_pages.pending": "[N/A]",
        "pcie.link.gen.current": "5",
        "pcie.link.gen.max": "5",
        "pcie.link.width.current": width,
        "pcie.link.width.max": "16",
        "clocks_throttle_reasons.active": reasons,
        "temperature.gpu": str(30 + i),
        "persistence_mode": "Enabled",
        "mig.mode.current": "Disabled",
    }
    values["clocks_event_reasons.active"] = reasons  # the newer name of the same field
    return values


def make_runner(rows, remap="", apps="", old_driver=True):
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        if argv == ["nvidia-smi"]:
            return CmdResult(0, HEADER, "")
        q = argv[1]
        kind, fields = q[len("--query-") :].split("=", 1)
        fields = fields.split(",")
        if kind == "gpu":
            if old_driver and "clocks_event_reasons.active" in fields:
                return CmdResult(
                    2, 'Field "clocks_event_reasons.active" is not a valid field to query.\n', ""
                )
            return CmdResult(0, "\n".join(", ".join(r[f] for f in fields) for r in rows) + "\n", "")
        if kind == "remapped-rows":
            return CmdResult(0, remap, "")
        return CmdResult(0, apps, "")

    return runner, calls


def test_cells():
    assert isinstance(cell("[N/A]"), Unavailable) and cell("[N/A]").kind == "not_supported"
    assert cell("[GPU requires reset]").kind == "gpu_lost"
    assert cell(" 5 ") == "5"
    assert parse_cuda_version(HEADER) == 13000


def test_gather_smi_renegotiates_fields_and_parses():
    rows = [gpu_row(0, "18"), gpu_row(1, "2A", width="8", ecc_vol="3")]
    remap = "00000000:18:00.0, 0, 0, 0, 0\n00000000:2A:00.0, 0, 2, 1, 0\n"
    apps = "00000000:2A:00.0, 4242, /usr/bin/python3, 1024\n"
    runner, calls = make_runner(rows, remap, apps)
    snap = gather_smi(runner)
    assert snap.ok and snap.source == "nvidia-smi" and snap.cuda_driver_version == 13000
    assert snap.driver_version == "580.159.04" and snap.device_count == 2
    g0, g1 = snap.gpus
    assert g0.compute_capability == (9, 0) and g0.pci_bus_id == "0000:18:00.0"
    assert g0.clock_event_reasons == 1 and g0.ecc_current is True and g0.persistence_mode is True
    assert g0.memory_total_bytes == 81559 << 20
    assert g1.pcie_width_current == 8 and g1.ecc_uncorrected_volatile == 3
    assert g1.remapped_rows == (0, 2, True, False)
    assert [p.pid for p in g1.processes] == [4242] and g0.processes == ()
    assert isinstance(g0.retired_pages_dbe, Unavailable)
    gpu_queries = [c for c in calls if len(c) > 1 and c[1].startswith("--query-gpu=")]
    assert len(gpu_queries) == 2 and "clocks_throttle_reasons.active" in gpu_queries[1][1]


def test_smi_snapshot_is_judged_like_nvml():
    rows = [gpu_row(i, b) for i, b in enumerate(S.H100_BUSES)]
    rows[3] = gpu_row(3, S.H100_BUSES[3], width="8")
    remap = "".join(f"00000000:{b}:00.0, 0, 0, 0, 0\n" for b in S.H100_BUSES)
    runner, _ = make_runner(rows, remap, old_driver=False)
    snap = dataclasses.replace(S.make_snapshot(), nvml=gather_smi(runner))
    results = {r.id: r for r in evaluate(snap, all_checks())[0]}
    assert results["gpu.E001"].status == Status.PASS and "nvidia-smi" in results["gpu.E001"].message
    assert results["gpu.E002"].status == Status.PASS
    assert results["gpu.E007"].status == Status.FAIL and "GPU 3" in results["gpu.E007"].message
    assert results["gpu.E005"].status == Status.PASS and results["gpu.E006"].status == Status.SKIP
    assert results["torch.E002"].status == Status.PASS


def test_smi_errors_become_values():
    def no_driver(argv, timeout):
        return CmdResult(
            9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", ""
        )

    snap = gather_smi(no_driver)
    assert not snap.ok and snap.error.kind == "not_installed"

    def mismatch(argv, timeout):
        return CmdResult(18, "Failed to initialize NVML: Driver/library version mismatch\n", "")

    assert "mismatch" in gather_smi(mismatch).error.reason


def test_pynvml_missing_falls_back_to_smi_and_reports_both_when_absent():
    def loader():
        raise ImportError("no pynvml")

    runner, _ = make_runner([gpu_row(0, "18")])
    snap = gather_nvml(loader=loader, fallback=lambda: gather_smi(runner))
    assert snap.ok and snap.source == "nvidia-smi"

    def absent(argv, timeout):
        return Unavailable("not_installed", "nvidia-smi not found")

    snap = gather_nvml(loader=loader, fallback=lambda: gather_smi(absent))
    assert not snap.ok and "nvidia-ml-py" in snap.error.reason and "nvidia-smi not found" in snap.error.reason


def test_gpu_fields_are_unique():
    assert len(set(GPU_FIELDS)) == len(GPU_FIELDS)


def test_an_unparsable_remapped_rows_cell_is_unknown_never_a_failed_remap():
    """A remapped-rows cell that is neither a number nor a flag (here 'Maybe') leaves the remap state unknown:
    gpu.E005 says it could not judge it, and never reports a failed or pending remap from it."""
    rows = [gpu_row(i, b) for i, b in enumerate(S.H100_BUSES)]
    remap = "".join(f"00000000:{b}:00.0, 0, 0, 0, 0\n" for b in S.H100_BUSES[1:])
    remap += f"00000000:{S.H100_BUSES[0]}:00.0, 0, 0, 0, Maybe\n"
    runner, _ = make_runner(rows, remap, old_driver=False)
    nvml = gather_smi(runner)
    assert isinstance(nvml.gpus[0].remapped_rows, Unavailable)
    snap = dataclasses.replace(S.make_snapshot(), nvml=nvml)
    e5 = {r.id: r for r in evaluate(snap, all_checks())[0]}["gpu.E005"]
    assert e5.status == Status.ERROR and "FAILED" not in e5.message and "GPU 0" in e5.message, e5


def test_a_gpu_nvidia_smi_cannot_reach_is_a_lost_row_among_the_others():
    """nvidia-smi prints 'Unable to determine the device handle for GPU <bus>: <why>' in place of a GPU it cannot
    reach (NVIDIA/open-gpu-kernel-modules#387) and goes on with the others: that GPU is lost, the rest are read."""
    rows = [gpu_row(i, b) for i, b in enumerate(S.H100_BUSES[:2])]
    good = make_runner(rows, old_driver=False)[0]

    def runner(argv, timeout):
        r = good(argv, timeout)
        if len(argv) > 1 and argv[1].startswith("--query-gpu="):
            bad = "Unable to determine the device handle for GPU 0000:3A:00.0: Unknown Error\n"
            return CmdResult(15, r.stdout + bad, "")
        return r

    snap = gather_smi(runner)
    assert snap.ok and len(snap.gpus) == 3
    lost = snap.gpus[2]
    assert lost.handle_error.kind == "gpu_lost" and lost.pci_bus_id == "0000:3a:00.0"
    assert "Unknown Error" in lost.handle_error.reason and snap.gpus[0].temperature_c == 30
