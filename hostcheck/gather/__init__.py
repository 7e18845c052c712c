"""Gathering: everything hostcheck reads from the node, as frozen snapshots (errors kept as values)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hostcheck.config import Config
from hostcheck.gather import state as counter_state
from hostcheck.gather.base import BUSY, CRASHED, TIMEOUT, Unavailable, read_text
from hostcheck.gather.busy import busy_reason
from hostcheck.gather.datapath import DataPathOptions, DataPathSnapshot, gather_datapath
from hostcheck.gather.facts import DEFAULT_FACTS_DIR, Facts, gather_facts
from hostcheck.gather.hardware import HOST_ROOT, HardwareSnapshot, gather_hardware
from hostcheck.gather.nvml import NvmlSnapshot, gather_nvml
from hostcheck.gather.system import SystemSnapshot, gather_system
from hostcheck.gather.torchinfo import TorchSnapshot, choose_python, gather_torch
from hostcheck.gather.tuning import (
    DEFAULT_ENV_FILE,
    DEFAULT_SERVICES_OFF,
    TuningSnapshot,
    gather_tuning,
    parse_env_file,
)
from hostcheck.gather.workload import DEFAULT_SECTIONS, WorkloadRun, gather_for, gather_limit
from hostcheck.registry import call_with_timeout

GATHERERS = ("facts", "system", "nvml", "torch", "tuning", "workload", "datapath", "hardware")


@dataclass(frozen=True)
class Options:
    expect_gpus: int | None = None
    python: str | None = None
    facts_dir: str = DEFAULT_FACTS_DIR
    env_file: str | None = None
    torch_timeout_s: float = 90.0
    gather_timeout_s: float = 60.0
    # Workload (hostcheck.gather.workload reads these).
    burn: float = 0.0
    nnodes: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str = "hostcheck"
    nproc_per_node: int | None = None
    workload_timeout_s: float = 180.0
    rdzv_timeout_s: float = 300.0
    workload_device: str = "auto"
    workload_sections: tuple[str, ...] = DEFAULT_SECTIONS
    #: Per-section arguments for the probes (sizes, durations), e.g. {"matmul": {"n": 8192}}.
    workload_section_args: dict[str, Any] | None = None
    #: Dataset directories (--data-dir; else gpunode_tuning.data_dirs in the local fact) and the read rate they
    #: must give in MB/s (--data-rate; else system.E005's default per GPU).
    data_dirs: tuple[str, ...] = ()
    data_rate_mb_s: float | None = None
    #: The run's deadline (time.monotonic()): every gatherer is cut off by then (hostcheck.profiles).
    deadline: float | None = None
    #: The configuration file's settings (thresholds, XID policy, GPU models) that checks read.
    config: Config = field(default_factory=Config)
    #: Where the node's /sys and /proc are (--host-root): a fixture tree in tests and scenarios.
    host_root: str = HOST_ROOT
    #: The counters of the last run (--state-file; else [hardware] state_file; else /var/lib/hostcheck).
    state_file: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the judging functions see. A part that was not gathered (not needed) is None."""

    options: Options = field(default_factory=Options)
    facts: Facts = field(default_factory=Facts)
    system: SystemSnapshot | None = None
    nvml: NvmlSnapshot | None = None
    torch: TorchSnapshot | None = None
    tuning: TuningSnapshot | None = None
    #: The workload run (hostcheck.gather.workload), or why there is none.
    workload: WorkloadRun | Unavailable | None = None
    #: The dataset directories' storage (hostcheck.gather.datapath).
    datapath: DataPathSnapshot | None = None
    #: EDAC, machine checks, D-state tasks, PCIe AER and the counters of the last run (hostcheck.gather.hardware).
    hardware: HardwareSnapshot | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def env_file(self) -> str:
        return self.options.env_file or self.facts.get("gpunode_tuning", "env_file") or DEFAULT_ENV_FILE


def _timed(
    name: str,
    fn: Callable[[], Any],
    timeout: float,
    fallback: Callable[[Unavailable], Any],
    timings: dict,
    deadline: float | None = None,
) -> Any:
    start = time.monotonic()
    cut = deadline is not None and deadline - start < timeout
    if cut:
        timeout = max(0.0, deadline - start)
    finished, value = call_with_timeout(fn, timeout) if timeout > 0 else (False, None)
    timings[name] = round(time.monotonic() - start, 3)
    if not finished:
        if cut:
            return fallback(Unavailable(TIMEOUT, f"gathering {name} was cut off by the run's deadline"))
        return fallback(Unavailable(TIMEOUT, f"gathering {name} did not finish in {timeout:g} s"))
    if isinstance(value, BaseException):
        return fallback(Unavailable(CRASHED, f"gathering {name} failed: {type(value).__name__}: {value}"))
    return value


# long: each gatherer's closure with its timing beside the threads that run them; a table of gatherers would halve it
def gather(options: Options, needs: frozenset[str] | set[str] = frozenset(GATHERERS)) -> Snapshot:
    """Run the gatherers the selected checks need; the torch probe and the workload run beside system and
    tuning."""
    timings: dict[str, float] = {}
    facts = gather_facts(options.facts_dir)
    env_file = options.env_file or facts.get("gpunode_tuning", "env_file") or DEFAULT_ENV_FILE
    results: dict[str, Any] = {}

    def do_torch() -> None:
        chosen: dict[str, str] = {}

        def probe() -> TorchSnapshot:
            chosen["python"], chosen["source"] = choose_python(options.python, facts)
            tuning_env = gather_tuning_env(env_file)
            return gather_torch(chosen["python"], chosen["source"], tuning_env, options.torch_timeout_s)

        # Whatever goes wrong, even before the probe starts, is the torch result's error: its checks say ERROR.
        results["torch"] = _timed(
            "torch",
            probe,
            options.torch_timeout_s + 5,
            lambda u: TorchSnapshot(
                python=chosen.get("python", ""), python_source=chosen.get("source", ""), error=u
            ),
            timings,
            options.deadline,
        )

    # NVML first, before the torch probe can open a CUDA context that would show up as a GPU process.
    if "nvml" in needs:
        results["nvml"] = _timed(
            "nvml",
            gather_nvml,
            options.gather_timeout_s,
            lambda u: NvmlSnapshot(error=u),
            timings,
            options.deadline,
        )
    threads = []
    if "torch" in needs:
        threads.append(threading.Thread(target=do_torch, daemon=True))
        threads[-1].start()

    # The workload starts now, beside the torch probe, so torch's import is not paid twice in a row; it runs
    # in the same training Python with the same environment file.
    def do_workload() -> None:
        def run() -> WorkloadRun:
            python, _ = choose_python(options.python, facts)
            return gather_for(options, python, gather_tuning_env(env_file))

        results["workload"] = _timed(
            "workload", run, gather_limit(options), lambda u: u, timings, options.deadline
        )

    # Never a GPU job beside someone else's: a busy node would only look slow.
    busy = busy_reason(results.get("nvml")) if "workload" in needs else None
    if busy:
        results["workload"] = Unavailable(BUSY, busy)
    elif "workload" in needs:
        threads.append(threading.Thread(target=do_workload, daemon=True))
        threads[-1].start()
    if "system" in needs:
        results["system"] = _timed(
            "system",
            lambda: gather_system(xid_window_hours=options.config.xid.window_hours),
            options.gather_timeout_s,
            lambda u: SystemSnapshot(),
            timings,
            options.deadline,
        )
    if "tuning" in needs:
        services = tuple(facts.get("gpunode_tuning", "services_disabled") or DEFAULT_SERVICES_OFF)
        results["tuning"] = _timed(
            "tuning",
            lambda: gather_tuning(env_file, services),
            options.gather_timeout_s,
            lambda u: TuningSnapshot(shm_bytes=u, env=u, governors=u, thp=u, services=u),
            timings,
            options.deadline,
        )
    if "datapath" in needs:
        dirs, source = tuple(options.data_dirs), "--data-dir"
        if not dirs:
            dirs, source = tuple(facts.get("gpunode_tuning", "data_dirs") or ()), "gpunode_tuning.data_dirs"
        # Measured beside whatever runs (the reads leave the page cache alone); a busy node is said, not skipped.
        busy = busy_reason(results["nvml"]) if "nvml" in results else None
        dp_opts = DataPathOptions(dirs=dirs, source=source if dirs else "", busy=busy)
        results["datapath"] = _timed(
            "datapath",
            lambda: gather_datapath(dp_opts),
            options.gather_timeout_s,
            lambda u: DataPathSnapshot(source=dp_opts.source, error=u),
            timings,
            options.deadline,
        )
    if "hardware" in needs:
        nv = results.get("nvml")
        replays = {
            str(g.uuid): g.pcie_replays
            for g in (nv.gpus if isinstance(nv, NvmlSnapshot) else ())
            if isinstance(g.uuid, str) and isinstance(g.pcie_replays, int)
        }
        state_file = (
            options.state_file or options.config.hardware.state_file or counter_state.DEFAULT_STATE_FILE
        )
        results["hardware"] = _timed(
            "hardware",
            lambda: gather_hardware(
                options.host_root, state_file, log_hours=options.config.xid.window_hours, replays=replays
            ),
            options.gather_timeout_s,
            lambda u: HardwareSnapshot(
                root=options.host_root,
                edac=u,
                aer=u,
                blocked=u,
                mce_lines=u,
                hung_lines=u,
                # Nothing compared, nothing kept: system.E010 says so instead of claiming a baseline.
                state=counter_state.CounterState(path=state_file, read_error=u, write_error=u),
            ),
            timings,
            options.deadline,
        )
    for t in threads:
        t.join()  # each is bounded by its own _timed timeout
    if "torch" in needs and "torch" not in results:  # the thread itself never came back
        results["torch"] = TorchSnapshot(error=Unavailable(CRASHED, "the torch gatherer did not come back"))
    if "workload" in needs and "workload" not in results:
        results["workload"] = Unavailable(CRASHED, "the workload gatherer did not come back")
    return Snapshot(
        options=options,
        facts=facts,
        system=results.get("system"),
        nvml=results.get("nvml"),
        torch=results.get("torch"),
        tuning=results.get("tuning"),
        workload=results.get("workload"),
        datapath=results.get("datapath"),
        hardware=results.get("hardware"),
        timings=timings,
    )


def gather_tuning_env(env_file: str) -> dict[str, str]:
    text = read_text(env_file, strict=True)
    return parse_env_file(text) if isinstance(text, str) else {}


__all__ = ["DEFAULT_SERVICES_OFF", "GATHERERS", "Options", "Snapshot", "gather"]
