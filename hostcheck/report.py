"""The Report: results + verdict + what was found on the host, the one input of every renderer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hostcheck import SCHEMA_VERSION, __version__
from hostcheck.gather.base import Unavailable
from hostcheck.registry import Result
from hostcheck.score import Verdict


def _v(x: Any) -> Any:
    return None if isinstance(x, Unavailable) else x


@dataclass(frozen=True)
class Report:
    results: tuple[Result, ...]
    verdict: Verdict
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    time: str = ""
    duration_s: float = 0.0
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "hostcheck", "version": __version__},
            "host": self.host,
            "time": self.time,
            "duration_s": round(self.duration_s, 3),
            "versions": self.versions,
            "checks": [r.to_dict() for r in self.results],
            "score": self.verdict.to_dict(),
            "exit_code": self.exit_code,
        }


def host_info(snap: Any) -> dict[str, Any]:
    s = snap.system
    host: dict[str, Any] = {}
    if s is not None:
        host = {
            "hostname": s.hostname,
            "os": s.os_pretty,
            "kernel": s.kernel,
            "arch": s.arch,
            "container": s.container,
            "logical_cpus": s.logical_cpus,
            "physical_cores": s.physical_cores,
            "numa_nodes": len(s.numa_nodes),
            "mem_total_bytes": s.mem_total_bytes,
            "nvswitches": len(s.fabric.nvswitches) if isinstance(s.fabric.nvswitches, tuple) else None,
        }
    n = snap.nvml
    if n is not None and n.ok:
        host["gpus"] = [
            {
                "index": g.index,
                "name": _v(g.name),
                "uuid": _v(g.uuid),
                "pci_bus_id": _v(g.pci_bus_id),
                "memory_total_bytes": _v(g.memory_total_bytes),
            }
            for g in n.gpus
        ]
    else:
        host["gpus"] = []
    return host


def versions(snap: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"hostcheck": __version__}
    s = snap.system
    if s is not None:
        out.update(os=s.os_pretty, kernel=s.kernel, hostcheck_python=s.hostcheck_python)
        out["libc"] = s.libc or None
        out["driver_kernel_module"] = _v(s.driver_version)
        out["fabricmanager"] = _v(s.fabric.fm_version)
    n = snap.nvml
    if n is not None:
        out["driver"] = _v(n.driver_version) if n.ok else None
        cuda = _v(n.cuda_driver_version) if n.ok else None
        out["driver_cuda"] = (
            f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda else None
        )
        out["nvml"] = _v(n.nvml_version) if n.ok else None
        out["nvml_source"] = n.source if n.ok else None
    t = snap.torch
    if t is not None:
        out["training_python"] = t.python
        out["training_python_version"] = t.data.get("python")
        ti = t.torch
        out["torch"] = ti.get("version")
        out["torch_cuda"] = ti.get("cuda")
        out["cudnn"] = ti.get("cudnn")
        out["nccl"] = ti.get("nccl")
    return out


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
