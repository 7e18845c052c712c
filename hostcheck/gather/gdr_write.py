"""GPUDirect RDMA write bandwidth per NIC (workload.E018): perftest's ``ib_write_bw`` with ``--use_cuda``, a server
and a client on the same port of the same NIC, both bound to the NIC's NUMA node with numactl, for a few seconds.

It runs as Azure HPC health checks' check_ib_bw_gdr does (customTests/azure_ib_write_bw_gdr.nhc: 8 MiB messages,
``-x 0 -F --report_gbits --perform_warm_up``, NIC i with GPU i, every NIC at once on its own TCP port), bounded by
``-D`` (perftest's duration) and the launcher's deadline. Only in the workload gatherer, so only in the profiles
that run GPU jobs (full, burnin), and only where perftest and numactl are installed. Parsing is pure
(:func:`parse_bw`); the commands start through the one launcher.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hostcheck.child.launch import Launch
from hostcheck.gather.base import Unavailable, run_cmd
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
            try:
                return float(cols[3])
            except ValueError:
                return None
    return None


def argv_for(
    device: str, tcp_port: int, gpu: int, numa: int | None, seconds: float, peer: str | None
) -> list[str]:
    args = ["ib_write_bw", "-p", str(tcp_port), "-s", str(MESSAGE_BYTES), "-x", "0", "-F", "--report_gbits"]
    args += ["--perform_warm_up", f"--use_cuda={gpu}", "-d", device, "-D", str(max(1, int(seconds)))]
    if peer:
        args.append(peer)
    bind = ["numactl", "-N", str(numa), "-m", str(numa)] if numa is not None and numa >= 0 else []
    return [*bind, *args]


def _one(port: Any, index: int, seconds: float, out: dict) -> None:
    tcp = FIRST_PORT + index
    numa = port.numa_node
    row = {
        "device": port.device,
        "port": port.port,
        "gpu": index,
        "numa_node": numa,
        "rate_gbps": port.rate_gbps,
    }
    server = Launch()
    try:
        try:
            p = server.start(argv_for(port.device, tcp, index, numa, seconds, None))
        except OSError as exc:
            row["error"] = f"the ib_write_bw server did not start: {exc}"
            return
        if p is None:
            row["error"] = "not started: the run was interrupted"
            return
        time.sleep(SERVER_START_S)
        got = run_cmd(argv_for(port.device, tcp, index, numa, seconds, "127.0.0.1"), seconds + SLACK_S)
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
        server.end()
        out[index] = row


def gather_gdr_write(ports: Any, gpus: int, seconds: float = SECONDS, which=shutil.which) -> GdrRun:
    """One ib_write_bw pair per ACTIVE InfiniBand port, NIC i with GPU i (at most ``gpus`` NICs), all at once."""
    for tool, package in (("ib_write_bw", "perftest"), ("numactl", "numactl")):
        if which(tool) is None:
            return GdrRun(skipped=f"{tool} not found (install {package})")
    if not isinstance(ports, tuple):
        return GdrRun(skipped=f"no RDMA port ({ports})")
    ib: Sequence[Any] = [p for p in ports if p.state == "ACTIVE" and p.link_layer == "InfiniBand"]
    if not ib:
        return GdrRun(skipped="no ACTIVE InfiniBand port")
    if gpus < 1:
        return GdrRun(skipped="no CUDA GPU for --use_cuda")
    out: dict[int, dict] = {}
    threads = [Thread(target=_one, args=(p, i, seconds, out), daemon=True) for i, p in enumerate(ib[:gpus])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + SLACK_S + SERVER_START_S + 10)
    return GdrRun(rows=tuple(out[i] for i in sorted(out)))
