"""The training Python, probed in a child process: torch/CUDA/cuDNN/NCCL, allocator, pillow-simd, threads.

The child runs with the training environment file applied (LD_PRELOAD, MALLOC_CONF, OMP_NUM_THREADS...),
so what it reports is what a training job launched by gpunode's launchers gets. A hung CUDA init is
killed by the timeout instead of hanging the report, and the step it hung in (PIL import, torch import,
CUDA init) is named.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from hostcheck.gather.base import ERROR, NOT_FOUND, NOT_INSTALLED, TIMEOUT, Unavailable
from hostcheck.schema import type_errors

MARKER = "HOSTCHECK_PROBE_JSON:"
DEFAULT_VENV = "/opt/gpunode/venv"


@dataclass(frozen=True)
class TorchSnapshot:
    python: str = ""
    #: How the Python was chosen: "--python", "fact gpunode_pytorch.venv", "default venv", "hostcheck's own".
    python_source: str = ""
    #: Set when the probe could not run at all (Python missing, timeout, crash).
    error: Unavailable | None = None
    data: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def torch(self) -> dict[str, Any]:
        return self.data.get("torch") or {}

    @property
    def torch_installed(self) -> bool:
        return bool(self.torch.get("installed")) and "version" in self.torch

    @property
    def env(self) -> dict[str, str]:
        return self.data.get("env") or {}

    @property
    def maps(self) -> dict[str, list[str]]:
        return self.data.get("maps") or {}

    @property
    def pillow(self) -> dict[str, Any]:
        return self.data.get("pillow") or {}


def choose_python(explicit: str | None, facts: Any) -> tuple[str, str]:
    """The training Python: --python, then the venv from local facts, then /opt/gpunode/venv, then ours."""
    if explicit:
        return explicit, "--python"
    for role in ("gpunode_pytorch", "gpunode_tuning"):
        venv = facts.get(role, "venv") if facts is not None else None
        if venv and os.path.exists(os.path.join(venv, "bin", "python")):
            return os.path.join(venv, "bin", "python"), f"fact {role}.venv"
    if os.path.exists(os.path.join(DEFAULT_VENV, "bin", "python")):
        return os.path.join(DEFAULT_VENV, "bin", "python"), "default venv"
    return sys.executable, "hostcheck's own Python"


def gather_torch(
    python: str,
    python_source: str = "",
    env_overrides: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    with_torch: bool = True,
) -> TorchSnapshot:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return TorchSnapshot(
            python=python,
            python_source=python_source,
            error=Unavailable(NOT_FOUND, f"training Python {python} not found or not executable"),
        )
    env = dict(os.environ)
    env.update(env_overrides or {})
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if not with_torch:
        env["HOSTCHECK_PROBE_NO_TORCH"] = "1"
    from hostcheck.child.launch import inside_argv, run_child

    # The one launcher: its own session, killed with its group at the deadline, swept on SIGINT/SIGTERM.
    argv = inside_argv(python, "probe")
    run = run_child(argv, timeout_s, name="torch probe", env=env, marker=MARKER)
    return probe_snapshot(run, python, python_source, timeout_s)


_STR, _OPT_STR, _OPT_INT = {"type": "string"}, {"type": ["string", "null"]}, {"type": ["integer", "null"]}
#: The types of the record hostcheck/inside/probe.py prints, in the form of hostcheck/schema.py. The training
#: Python is someone else's (a sitecustomize or a fake torch can print anything on its standard output): a record
#: of other types is the torch gatherer's error, never a crash in a check that reads it.
PROBE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "python": _STR,
        "executable": _OPT_STR,
        "prefix": _OPT_STR,
        "env": {"type": "object", "additionalProperties": _STR},
        "affinity": _OPT_INT,
        "rlimits": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "integer"}},
        },
        "pillow": {
            "type": "object",
            "properties": {
                "version": _OPT_STR,
                "simd": {"type": "boolean"},
                "path": _OPT_STR,
                "dists": {"type": "object", "additionalProperties": _STR},
                "owner": _OPT_STR,
                "error": _STR,
                "pillow-simd": _OPT_STR,
                "Pillow": _OPT_STR,
                "PIL": _OPT_STR,
                "PIL_error": _STR,
                "libjpeg_turbo": _OPT_STR,
                "imaging_so": _OPT_STR,
                "features": {"type": "object", "additionalProperties": {"type": "boolean"}},
            },
        },
        "torch": {
            "type": "object",
            "properties": {
                "installed": {"type": "boolean"},
                "error": _STR,
                "import_s": {"type": "number"},
                "version": _STR,
                "cuda": _OPT_STR,
                "cudnn": _OPT_INT,
                "nccl": _OPT_STR,
                "cuda_available": {"type": "boolean"},
                "device_count": {"type": "integer", "minimum": 0},
                "capabilities": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                "arch_list": {"type": "array", "items": _STR},
                "cuda_error": _STR,
                "cuda_init_s": {"type": "number"},
                "warnings": {"type": "array", "items": _STR},
                "num_threads": _OPT_INT,
            },
        },
        "maps": {"type": "object", "additionalProperties": {"type": "array", "items": _STR}},
        "symbols": {"type": "object", "additionalProperties": {"type": "boolean"}},
    },
}


def probe_snapshot(run: Any, python: str, python_source: str = "", timeout_s: float = 0.0) -> TorchSnapshot:
    """The probe's last record, or why there is none (``run``: a ProbeRun of hostcheck.child.launch)."""
    from hostcheck.child.launch import describe_rc

    results = [r for r in run.records if "phase" not in r]
    if results:
        wrong = type_errors(results[-1], PROBE_SCHEMA, "record")
        if wrong:
            return TorchSnapshot(
                python=python,
                python_source=python_source,
                error=Unavailable(
                    ERROR, f"probe in {python} printed a record of the wrong types: {'; '.join(wrong)}"
                ),
                wall_s=run.wall_s,
            )
        return TorchSnapshot(python=python, python_source=python_source, data=results[-1], wall_s=run.wall_s)
    if run.timed_out:
        # The probe names each slow step as it starts: a hung PIL import is not a hung CUDA init.
        phases = [r["phase"] for r in run.records if "phase" in r]
        where = f"hung in {phases[-1]}" if phases else "hung before its first step"
        return TorchSnapshot(
            python=python,
            python_source=python_source,
            error=Unavailable(TIMEOUT, f"probe in {python} did not finish in {timeout_s:g} s: {where}"),
            wall_s=run.wall_s,
        )
    said = [ln for ln in run.stderr_tail.strip().splitlines() if ln.strip()]
    tail = (said[-1] if said else run.error or "no output")[:300]
    kind = NOT_INSTALLED if "No module named" in tail else ERROR
    how = describe_rc(run.rc) if run.rc is not None else "not started"
    return TorchSnapshot(
        python=python,
        python_source=python_source,
        error=Unavailable(kind, f"probe in {python} failed ({how}): {tail}"),
        wall_s=run.wall_s,
    )
