"""GPUDirect RDMA write bandwidth per NIC (workload.E018): perftest's ``ib_write_bw`` with ``--use_cuda``, a server
and a client on the same port of the same NIC, both bound to the NIC's NUMA node with numactl, for a few seconds.

It runs as Azure HPC health checks' check_ib_bw_gdr does (customTests/azure_ib_write_bw_gdr.nhc: 8 MiB messages,
``-x 0 -F --report_gbits --perform_warm_up``, every NIC at once on its own TCP port), bounded by ``-D`` (perftest's
duration) and the launcher's deadline, each NIC with the GPU it serves by PCIe topology
(hostcheck.gather.rdma_rate: the GPU under the NIC's PCIe switch, never the i-th GPU for the i-th name: mlx5_10
sorts before mlx5_2). ``--use_cuda`` takes CUDA's index, so the commands run with CUDA_DEVICE_ORDER=PCI_BUS_ID and
without CUDA_VISIBLE_DEVICES: CUDA then numbers the GPUs in PCI address order, as the pairing does. Only in the workload gatherer, so only in the profiles
that run GPU jobs (full, burnin), and only where perftest and numactl are installed. Parsing is pure
(:func:`parse_bw`); both ends run as every tool does (base.Tool).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hostcheck.gather.base import Tool, Unavailable, parse_number, run_cmd
from hostcheck.registry import Thread

MESSAGE_BYTES = 8 << 20
#: Seconds each NIC measures (perftest's -D).
SECONDS = 5.0
FIRST_PORT = 18510
#: How long the server gets to listen before the client connects.
SERVER_START_S = 2.0
#: Slack over the measured seconds before a client is killed.
SLACK_S = 20.0


@dataclass(frozen=True)
class GdrRun:
    """What the runs gave: one row per NIC ({device, port, gpu, numa_node, gbps | error}), or why none ran."""

    rows: tuple[dict, ...] = ()
    skipped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "skipped": self.skipped}


def parse_bw(text: str, message_bytes: int = MESSAGE_BYTES) -> float | None:
    """BW average (Gb/s, --report_gbits) from ib_write_bw's result line: the one starting with the message size
    (``#bytes #iterations BW peak BW average MsgRate``); None when there is none."""
    for line in (text or "").splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0] == str(message_bytes):
            return parse_number(cols[3])
    return None


#: CUDA numbers the GPUs in PCI address order, every GPU visible: the order the pairing's index is in.
CUDA_ORDER = ["env", "-u", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER=PCI_BUS_ID"]


def argv_for(
    device: str, tcp_port: int, gpu: int, numa: int | None, seconds: float, peer: str | None
) -> list[str]:
    args = ["ib_write_bw", "-p", str(tcp_port), "-s", str(MESSAGE_BYTES), "-x", "0", "-F", "--report_gbits"]
    args += ["--perform_warm_up", f"--use_cuda={gpu}", "-d", device, "-D", str(max(1, int(seconds)))]
    if peer:
        args.append(peer)
    bind = ["numactl", "-N", str(numa), "-m", str(numa)] if numa is not None and numa >= 0 else []
    return [*CUDA_ORDER, *bind, *args]


def _one(port: Any, index: int, seconds: float, out: dict) -> None:
    tcp = FIRST_PORT + index
    numa = port.numa_node
    gpu = port.gpu
    row = {
        "device": port.device,
        "port": port.port,
        "gpu": gpu,
        "gpu_pci": getattr(port, "gpu_pci", None),
        "numa_node": numa,
        "rate_gbps": port.rate_gbps,
    }
    # Both ends are tools like any other (base.Tool): their output to pipes read here, never to hostcheck's own
    # stdout (the server's banner once landed in --json), bounded, their groups killed on every way out.
    server = Tool(argv_for(port.device, tcp, gpu, numa, seconds, None))
    try:
        if server.error is not None:
            row["error"] = f"the ib_write_bw server did not start: {server.error.reason}"
            return
        server.read(SERVER_START_S)  # it listens meanwhile; what it prints is read, not left in the pipe
        got = run_cmd(argv_for(port.device, tcp, gpu, numa, seconds, "127.0.0.1"), seconds + SLACK_S)
        if isinstance(got, Unavailable):
            row["error"] = str(got)
        elif got.rc != 0:
            said = [ln for ln in (got.stderr + got.stdout).splitlines() if ln.strip()]
            row["error"] = f"ib_write_bw exited {got.rc}: {said[-1][:200] if said else 'no output'}"
        else:
            bw = parse_bw(got.stdout)
            if bw is None:
                row["error"] = "no result line in ib_write_bw's output"
            else:
                row["gbps"] = bw
    finally:
        server.close()
        out[index] = row


def gather_gdr_write(ports: Any, gpus: int, seconds: float = SECONDS, which=shutil.which) -> GdrRun:
    """One ib_write_bw pair per ACTIVE InfiniBand port whose NIC serves a GPU by PCIe topology, with that GPU (one
    of the ``gpus`` CUDA sees), all at once."""
    for tool, package in (("ib_write_bw", "perftest"), ("numactl", "numactl"), ("env", "coreutils")):
        if which(tool) is None:
            return GdrRun(skipped=f"{tool} not found (install {package})")
    if not isinstance(ports, tuple):
        return GdrRun(skipped=f"no RDMA port ({ports})")
    ib: Sequence[Any] = [p for p in ports if p.state == "ACTIVE" and p.link_layer == "InfiniBand"]
    if not ib:
        return GdrRun(skipped="no ACTIVE InfiniBand port")
    if gpus < 1:
        return GdrRun(skipped="no CUDA GPU for --use_cuda")
    paired = sorted((p for p in ib if p.gpu is not None and p.gpu < gpus), key=lambda p: (p.gpu, p.device))
    if not paired:
        return GdrRun(
            skipped="no ACTIVE InfiniBand port's NIC is paired with a GPU by PCIe topology (no GPU or NIC PCI "
            "path read): GPUs are never matched to NICs by name order"
        )
    out: dict[int, dict] = {}
    threads = [Thread(target=_one, args=(p, i, seconds, out), daemon=True) for i, p in enumerate(paired)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + SLACK_S + SERVER_START_S + 10)
    return GdrRun(rows=tuple(out[i] for i in sorted(out)))
