"""Gathering: everything hostcheck reads from the node, as frozen snapshots (errors kept as values)."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hostcheck.config import Config
from hostcheck.gather import dcgm as dcgm_gather
from hostcheck.gather import state as counter_state
from hostcheck.gather.base import (
    BUSY,
    CRASHED,
    HOST_ROOT,
    TIMEOUT,
    Runner,
    Unavailable,
    read_text,
    run_cmd,
    under,
)
from hostcheck.gather.busy import busy_reason
from hostcheck.gather.datapath import DataPathOptions, DataPathSnapshot, gather_datapath
from hostcheck.gather.dcgm import DcgmSnapshot, gather_dcgm
from hostcheck.gather.facts import DEFAULT_FACTS_DIR, Facts, gather_facts
from hostcheck.gather.hardware import HardwareSnapshot, gather_hardware
from hostcheck.gather.hardware import counters_of as hardware_counters
from hostcheck.gather.inventory import NodeInventory, gather_inventory
from hostcheck.gather.nccl_conf import NcclConfig, read_nccl_config
from hostcheck.gather.nvml import NvmlSnapshot, gather_nvml, nvlink_counters
from hostcheck.gather.rdma import RdmaSnapshot, gather_rdma
from hostcheck.gather.rdma import counters_of as rdma_counters
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
from hostcheck.registry import Thread, call_with_timeout

GATHERERS = (
    "facts",
    "system",
    "nvml",
    "torch",
    "tuning",
    "workload",
    "datapath",
    "hardware",
    "rdma",
    "inventory",
    "dcgm",
)


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
    #: ``dcgmi diag -r`` level (the profile's dcgm_level); 0: DCGM's health watches only.
    dcgm_level: int = 0
    #: Told each gatherer's start and end (``begin(step)``, ``end(step)``: hostcheck.progress's line on a terminal).
    progress: Any = field(default=None, compare=False, repr=False)

    @property
    def state_path(self) -> str:
        """The state file this run reads and writes: --state-file, else [hardware] state_file, else the default."""
        return self.state_file or self.config.hardware.state_file or counter_state.DEFAULT_STATE_FILE


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
    #: RDMA ports, GPU-NIC PCI paths, ACS, GPUDirect and the NCCL variables (hostcheck.gather.rdma).
    rdma: RdmaSnapshot | None = None
    #: What the node has, for the baseline checks (hostcheck.gather.inventory).
    inventory: NodeInventory | None = None
    #: DCGM's diagnostic at the profile's level and its health watches (hostcheck.gather.dcgm).
    dcgm: DcgmSnapshot | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def env_file(self) -> str:
        return self.options.env_file or self.facts.get("gpunode_tuning", "env_file") or DEFAULT_ENV_FILE


#: What a person watching the progress line reads for each gatherer.
STEP_NAMES = {
    "nvml": "NVML",
    "system": "kernel log",
    "tuning": "tuning",
    "torch": "torch probe",
    "workload": "GPU workload",
    "datapath": "dataset reads",
    "hardware": "host hardware",
    "rdma": "RDMA ports",
    "inventory": "inventory",
    "dcgm": "DCGM",
}


def _timed(
    name: str,
    fn: Callable[[], Any],
    timeout: float,
    fallback: Callable[[Unavailable], Any],
    timings: dict,
    deadline: float | None = None,
    progress: Any = None,
) -> Any:
    start = time.monotonic()
    cut = deadline is not None and deadline - start < timeout
    if cut:
        timeout = max(0.0, deadline - start)
    step = STEP_NAMES.get(name, name)
    if progress is not None:
        progress.begin(step)
    finished, value = call_with_timeout(fn, timeout) if timeout > 0 else (False, None)
    if progress is not None:
        progress.end(step)
    timings[name] = round(time.monotonic() - start, 3)
    if not finished:
        if cut:
            return fallback(Unavailable(TIMEOUT, f"gathering {name} was cut off by the run's deadline"))
        return fallback(Unavailable(TIMEOUT, f"gathering {name} did not finish in {timeout:g} s"))
    if isinstance(value, BaseException):
        return fallback(Unavailable(CRASHED, f"gathering {name} failed: {type(value).__name__}: {value}"))
    return value


def run_once(runner: Runner | None = None) -> Runner:
    """``runner`` answering a command line it ran before in this run with the same answer: the kernel log is read
    for the XIDs (system) and for the machine checks and hung tasks (hardware) with one journalctl or dmesg, and a
    journalctl that timed out for the first is not waited for again by the second."""
    answers: dict[Any, Any] = {}
    runner = runner or run_cmd

    def run(argv: Any, *args: Any, **kwargs: Any) -> Any:
        key = (tuple(argv), args, tuple(sorted(kwargs.items())))
        if key not in answers:
            answers[key] = runner(argv, *args, **kwargs)
        return answers[key]

    # Keywords reach run_cmd: a caller may ask it for the tail of a long answer (the kernel log).
    run.keeps_tail = runner is run_cmd or getattr(runner, "keeps_tail", False)  # type: ignore[attr-defined]
    return run


def _beside(fn: Callable[[], None], threads: list[Thread]) -> None:
    """Run ``fn`` in a thread of its own beside what follows (added to ``threads``), or here and now when no
    thread can be had (a small ulimit -v): its own gathering then says why it could not run, if it cannot."""
    try:
        t = Thread(target=fn, daemon=True)
        t.start()
    except RuntimeError:  # ThreadStartError, or no lock for a thread to be had ("can't allocate lock")
        fn()
        return
    threads.append(t)


# long: each gatherer's closure with its timing beside the threads that run them; a table of gatherers would halve it
def gather(options: Options, needs: frozenset[str] | set[str] = frozenset(GATHERERS)) -> Snapshot:
    """Run the gatherers the selected checks need; the torch probe and the workload run beside system and
    tuning."""
    timings: dict[str, float] = {}
    runner = run_once()
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
            options.progress,
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
            options.progress,
        )
    threads = []
    if "torch" in needs:
        _beside(do_torch, threads)

    # The workload starts now, beside the torch probe, so torch's import is not paid twice in a row; it runs
    # in the same training Python with the same environment file.
    def do_workload() -> None:
        def run() -> WorkloadRun:
            python, _ = choose_python(options.python, facts)
            return gather_for(options, python, gather_tuning_env(env_file))

        results["workload"] = _timed(
            "workload", run, gather_limit(options), lambda u: u, timings, options.deadline, options.progress
        )

    # Never a GPU job beside someone else's: a busy node would only look slow.
    busy = busy_reason(results.get("nvml")) if "workload" in needs else None
    if busy:
        results["workload"] = Unavailable(BUSY, busy)
    elif "workload" in needs:
        _beside(do_workload, threads)
    if "system" in needs:
        # The NVSwitches are looked up under the one host root; "/" is the gatherer's own default.
        root_kw = {"root": options.host_root} if options.host_root != HOST_ROOT else {}
        results["system"] = _timed(
            "system",
            lambda: gather_system(runner=runner, xid_window_hours=options.config.xid.window_hours, **root_kw),
            options.gather_timeout_s,
            lambda u: SystemSnapshot(),
            timings,
            options.deadline,
            options.progress,
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
            options.progress,
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
            options.progress,
        )
    # The counters of the last run: loaded once for every gatherer that compares with them, saved once below.
    state_file = options.state_path
    state = counter_state.load_state(state_file) if needs & {"hardware", "rdma"} else None
    now = time.time()
    if "hardware" in needs:
        nv = results.get("nvml")
        replays = {
            str(g.uuid): g.pcie_replays
            for g in (nv.gpus if isinstance(nv, NvmlSnapshot) else ())
            if isinstance(g.uuid, str) and isinstance(g.pcie_replays, int)
        }
        links = nvlink_counters(nv.gpus if isinstance(nv, NvmlSnapshot) else ())
        results["hardware"] = _timed(
            "hardware",
            lambda: gather_hardware(
                options.host_root,
                state_file,
                log_hours=options.config.xid.window_hours,
                runner=runner,
                replays=replays,
                now=now,
                state=state,
                nvlink=links,
            ),
            options.gather_timeout_s,
            lambda u: HardwareSnapshot(
                root=options.host_root,
                edac=u,
                aer=u,
                blocked=u,
                mce_lines=u,
                hung_lines=u,
                edac_ue_lines=u,
                # Nothing compared, nothing kept: system.E010 says so instead of claiming a baseline.
                state=counter_state.CounterState(path=state_file, read_error=u, write_error=u),
            ),
            timings,
            options.deadline,
            options.progress,
        )
    if "rdma" in needs:
        results["rdma"] = _timed(
            "rdma",
            lambda: gather_rdma(options.host_root, state, fabric_nccl(options, env_file), now),
            options.gather_timeout_s,
            lambda u: RdmaSnapshot(
                root=options.host_root,
                devices=u,
                state=counter_state.CounterState(path=state_file, read_error=u, write_error=u),
                taken_at=now,
            ),
            timings,
            options.deadline,
            options.progress,
        )
    if "inventory" in needs:
        results["inventory"] = _timed(
            "inventory",
            lambda: gather_inventory(options.host_root, results.get("nvml")),
            options.gather_timeout_s,
            lambda u: NodeInventory(
                root=options.host_root,
                cpu=u,
                memory_bytes=u,
                numa_cpus=u,
                nvme=u,
                nics=u,
                rdma=u,
                links=u,
                gpus=u,
            ),
            timings,
            options.deadline,
            options.progress,
        )
    if state is not None:
        _save_counters(state, results, now)
    for t in threads:
        t.join()  # each is bounded by its own _timed timeout
    if "dcgm" in needs:
        # After the workload: DCGM's diagnostic loads the GPUs, never beside hostcheck's own GPU job. Its time is
        # what is left of the run's deadline (levels 2 and 3 take minutes), less a reserve for judging.
        busy_now = busy_reason(results.get("nvml")) if options.dcgm_level >= 2 else None
        limit = options.gather_timeout_s + dcgm_gather.HEALTH_TIMEOUT_S + 5
        if options.deadline is not None:
            limit = max(limit, options.deadline - time.monotonic())
        results["dcgm"] = _timed(
            "dcgm",
            lambda: gather_dcgm(
                options.dcgm_level, options.deadline, options.gather_timeout_s, busy=busy_now
            ),
            limit,
            lambda u: DcgmSnapshot(
                dcgmi="dcgmi", level=options.dcgm_level, diag=u if options.dcgm_level else None, health=u
            ),
            timings,
            options.deadline,
            options.progress,
        )
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
        rdma=results.get("rdma"),
        inventory=results.get("inventory"),
        dcgm=results.get("dcgm"),
        timings=timings,
    )


def _save_counters(state: counter_state.CounterState, results: dict[str, Any], now: float) -> None:
    """Keep the counters every gatherer read in one write (the namespaces this run did not read keep their last
    values), and hand each snapshot the state with the write's outcome. A gatherer that did not finish has its
    own error state and is left as it is."""
    current: dict[str, dict[str, int]] = {}
    done = {}
    for name, counters_of in (("hardware", hardware_counters), ("rdma", rdma_counters)):
        snap = results.get(name)
        if snap is not None and snap.state is state:
            current.update(counters_of(snap))
            done[name] = snap
    if not done:
        return
    saved = counter_state.save_state(state, current, now)
    for name, snap in done.items():
        results[name] = dataclasses.replace(snap, state=saved)


def fabric_nccl(options: Options, env_file: str) -> NcclConfig:
    """NCCL's configuration for the fabric checks, all of it under the one host root: under another root than /
    neither this process's environment nor this machine's facts or files are read (a training environment file
    named on the command line is read as named)."""
    users = options.config.fabric.nccl_users
    root = options.host_root
    if root == HOST_ROOT:
        return read_nccl_config(root, env_file, os.environ, users)
    path = options.env_file
    if not path:
        facts_dir = options.facts_dir
        if facts_dir == DEFAULT_FACTS_DIR:
            facts_dir = under(root, DEFAULT_FACTS_DIR)
        named = gather_facts(facts_dir).get("gpunode_tuning", "env_file")
        path = under(root, named if isinstance(named, str) and named else DEFAULT_ENV_FILE)
    return read_nccl_config(root, path, None, users)


def gather_tuning_env(env_file: str) -> dict[str, str]:
    text = read_text(env_file, strict=True)
    return parse_env_file(text) if isinstance(text, str) else {}


__all__ = ["DEFAULT_SERVICES_OFF", "GATHERERS", "Options", "Snapshot", "gather"]
