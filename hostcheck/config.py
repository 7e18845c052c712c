"""The one configuration file (TOML): /etc/gpunode/hostcheck.toml or ``--config PATH``.

It holds what a site tunes: the profile, thresholds, the XID policy, per-check selection, the GPU count and
per-GPU-model figures, Slurm and Prometheus settings. gpunode_health writes it from the inventory, so
provisioning intent and health thresholds come from one place. Command-line options win over the file.

A bad file is a :class:`ConfigError` naming the file, the key and the reason (``hostcheck`` exits 2 with
it), never a traceback. This module imports nothing of hostcheck but its data files, the bounded reader and
the names it validates against (profiles, fail levels): the gatherers and the checks read the frozen
:class:`Config` from ``snapshot.options.config``.

Why one module: every section is read by the same typed table reader, so every bad key is refused with the same
kind of message before anything runs; a section split out would need that reader and its messages again.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostcheck import infile, thresholds
from hostcheck.profiles import PROFILES
from hostcheck.score import FAIL_LEVELS

DEFAULT_PATH = "/etc/gpunode/hostcheck.toml"
XID_DATA = Path(__file__).resolve().parent / "data" / "xid.json"
THRESHOLDS_DATA = thresholds.NODE_FILE
DTYPES = ("bf16", "fp16", "tf32", "fp32")
XID_ACTIONS = ("fail", "warn", "ignore")
#: Longest Slurm drain reason we write: it stays readable in ``sinfo -R`` and node-problem-detector's
#: 80-character message limit.
REASON_MAX = 80


class ConfigError(ValueError):
    """A bad configuration file: ``str()`` is one line with the file, the key and the reason."""

    def __init__(self, path: str, key: str, reason: str) -> None:
        self.path, self.key, self.reason = path, key, reason
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + reason)


@dataclass(frozen=True)
class XidPolicy:
    """What an XID in the kernel log means for the verdict: fail, warn or ignore; unlisted ones get
    ``unlisted``. Only events within the last ``window_hours`` count."""

    fail: frozenset[int] = frozenset()
    warn: frozenset[int] = frozenset()
    ignore: frozenset[int] = frozenset()
    unlisted: str = "warn"
    #: hostcheck/data/xid.json's window_hours (with its public source) unless a site sets its own.
    window_hours: float = field(default_factory=lambda: default_xid_policy().window_hours)
    #: XID -> (meaning, public source), from hostcheck/data/xid.json.
    meaning: dict[int, tuple[str, str]] = field(default_factory=dict, compare=False)

    def action(self, xid: int) -> str:
        if xid in self.ignore:
            return "ignore"
        if xid in self.fail:
            return "fail"
        if xid in self.warn:
            return "warn"
        return self.unlisted


def _threshold_defaults(path: Path) -> dict[str, Any]:
    """name -> value of one thresholds file, read through the one loader (hostcheck/thresholds.py): a malformed
    file raises ValueError naming it, never a silent default."""
    return {name: row.value for name, row in thresholds.load(path).items()}


#: The node checks' lines, one field per row of hostcheck/data/thresholds.json (its value by default).
Thresholds = thresholds.NodeThresholds
#: The job doctor's lines, one field per row of hostcheck/data/job_thresholds.json.
JobThresholds = thresholds.JobThresholds


@dataclass(frozen=True)
class GpuModel:
    """A site's expected figures for a GPU model: ``match`` is a regular expression on the device name
    (case-insensitive); matmul figures in TFLOP/s per dtype, device copy in GB/s (read + write)."""

    match: str
    name: str
    matmul_tflops: dict[str, float] = field(default_factory=dict)
    copy_gbs: float | None = None


@dataclass(frozen=True)
class SlurmSettings:
    #: Drain this node through scontrol when it is not ready, resume it when it is (only our own drains).
    drain: bool = False
    #: The Slurm node name (default: $SLURMD_NODENAME, else the short host name).
    node: str = ""
    reason_prefix: str = "hostcheck"
    scontrol: str = "scontrol"


_DEFAULT_XID: XidPolicy | None = None


def default_xid_policy() -> XidPolicy:
    """The shipped XID policy (hostcheck/data/xid.json: every row with its public source)."""
    global _DEFAULT_XID
    if _DEFAULT_XID is None:
        _DEFAULT_XID = _xid_from_data(XID_DATA)
    return _DEFAULT_XID


MIG_EXPECT = ("same", "off", "on")


@dataclass(frozen=True)
class HardwareSettings:
    """[hardware]: where the counters of the last run are kept and what the GPUs of a node should agree on."""

    #: The state file behind "rising since the last run" (hostcheck.gather.state).
    state_file: str | None = None
    #: MIG mode expected on every GPU: "same" (off everywhere or on everywhere), "off" or "on".
    mig: str = "same"
    #: Application clocks (graphics, memory MHz) the site sets; None: the board's defaults.
    app_clocks_mhz: tuple[int, int] | None = None


LINK_LAYERS = ("InfiniBand", "Ethernet")
#: NCCL's PCIe distances between a GPU and a NIC, nearest first (hostcheck.gather.rdma.LEVELS).
DISTANCES = ("PIX", "PXB", "PHB", "SYS")
PORT_ROLES = ("rail", "other", "any")
RAIL, OTHER, ANY_ROLE = PORT_ROLES


@dataclass(frozen=True)
class PortClass:
    """[[fabric.ports]]: a class of RDMA ports and what each should be. A port belongs to the first class whose
    ``devices`` (globs on the RDMA device name; none: every device) and ``role`` match it: "rail" a GPU's NIC by
    PCIe topology (hostcheck.gather.rdma.rails), "other" any other (front-end, storage), "any" either."""

    name: str
    devices: tuple[str, ...] = ()
    role: str = ANY_ROLE
    #: Ports of the class expected on the node.
    count: int | None = None
    #: Each port's rate in Gb/s, as the kernel's ``rate`` file says it (400 for NDR).
    rate_gbps: float | None = None
    #: "InfiniBand" or "Ethernet" (RoCE).
    link_layer: str | None = None

    def matches(self, device: str, role: str | None) -> bool:
        """``role``: the port's, or None where the node's topology does not tell (then any class matches)."""
        if self.devices and not any(fnmatch.fnmatchcase(device, g) for g in self.devices):
            return False
        return self.role == ANY_ROLE or role is None or self.role == role


@dataclass(frozen=True)
class FabricSettings:
    """[fabric]: what this node type's RDMA ports should be. The flat keys describe the rails (the ports of the
    NICs paired with a GPU); [[fabric.ports]] classes describe any others. Unset, the ports are compared with
    their peers and only warn."""

    #: Rail ports expected (the ports of the RDMA devices paired with a GPU by PCIe topology).
    expected_ports: int | None = None
    #: Each rail port's rate in Gb/s, as the kernel's ``rate`` file says it (400 for NDR).
    rate_gbps: float | None = None
    #: The rails' link layer: "InfiniBand" or "Ethernet" (RoCE).
    link_layer: str | None = None
    #: The farthest a GPU's rail NIC may be, in NCCL's words (PIX, PXB, PHB, SYS); beyond it fails.
    max_distance: str | None = None
    ports: tuple[PortClass, ...] = ()
    #: Users whose ~/.nccl.conf is read (the training users).
    nccl_users: tuple[str, ...] = ()

    def classes(self) -> tuple[PortClass, ...]:
        """The port classes in matching order: the flat keys' rails first."""
        flat = (self.expected_ports, self.rate_gbps, self.link_layer)
        rails = (PortClass("rails", (), RAIL, *flat),) if any(v is not None for v in flat) else ()
        return rails + self.ports


@dataclass(frozen=True)
class Baseline:
    """[baseline]: what a known-good node of this type has, as ``hostcheck baseline`` recorded it (docs/baseline.md).
    A key left out is not compared. Devices are lists of small tables, keyed by their name or PCI address."""

    recorded_on: str | None = None
    recorded_at: str | None = None
    cpu_model: str | None = None
    cpu_sockets: int | None = None
    cpu_cores: int | None = None
    cpu_threads: int | None = None
    memory_bytes: int | None = None
    #: Each NUMA node's CPU list ("0-55,112-167"), by node number.
    numa_cpus: tuple[str, ...] | None = None
    #: (model, size in bytes) per NVMe controller.
    nvme: tuple[tuple[str, int], ...] | None = None
    #: (interface, speed in Mb/s) per physical network port.
    nics: tuple[tuple[str, float], ...] | None = None
    #: (device:port, rate in Gb/s, link layer, paired GPU's PCI address, NCCL distance to it) per RDMA port; the
    #: last three "" where not recorded (a baseline written before they were) or not paired.
    rdma: tuple[tuple[str, float, str, str, str], ...] | None = None
    #: (PCI address, name, VBIOS) per GPU.
    gpus: tuple[tuple[str, str, str], ...] | None = None
    #: (PCI address, kind, speed GT/s, width, max speed GT/s, max width) per GPU and NIC function.
    pcie: tuple[tuple[str, str, float, int, float, int], ...] | None = None


#: [baseline]'s device lists: key -> {field: (types, what)}, in the order of Baseline's tuples.
BASELINE_LISTS: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "nvme": {"model": ((str,), "a string"), "size_bytes": ((int,), "an integer")},
    "nics": {"name": ((str,), "a string"), "speed_mbps": ((int, float), "a number")},
    "rdma": {"name": ((str,), "a string"), "rate_gbps": ((int, float), "a number")},
    "gpus": {"address": ((str,), "a string"), "name": ((str,), "a string"), "vbios": ((str,), "a string")},
    "pcie": {
        "address": ((str,), "a string"),
        "kind": ((str,), "a string"),
        "speed_gts": ((int, float), "a number"),
        "width": ((int,), "an integer"),
        "max_speed_gts": ((int, float), "a number"),
        "max_width": ((int,), "an integer"),
    },
}
#: [baseline]'s optional fields per list (read as "" when absent): what a baseline written before them lacks.
BASELINE_OPTIONAL: dict[str, dict[str, tuple[str, ...]]] = {
    "rdma": {"link_layer": ("", *LINK_LAYERS), "gpu": (), "distance": ("", *DISTANCES)},
}
#: Entries per device list at most: a node has tens of devices.
BASELINE_MAX_ITEMS = 1024
#: Rows a configuration may still name from an earlier release, and what replaced them: refused with that, so a
#: site learns what to set instead.
RETIRED_THRESHOLDS = {
    "rdma_error_rise_fail": "fabric.E003 judges each port counter per unit of time now, against the rows "
    "rdma_symbol_error_fail_per_h, rdma_fatal_counter_rise_fail and their warning lines (docs/fabric.md)",
}


@dataclass(frozen=True)
class Config:
    path: str | None = None
    profile: str | None = None
    expect_gpus: int | None = None
    fail_level: str | None = None
    min_score: int | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    job_thresholds: JobThresholds = field(default_factory=JobThresholds)
    xid: XidPolicy = field(default_factory=default_xid_policy)
    gpu_models: tuple[GpuModel, ...] = ()
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    prometheus: str | None = None
    hardware: HardwareSettings = field(default_factory=HardwareSettings)
    fabric: FabricSettings = field(default_factory=FabricSettings)
    #: [baseline]: what a known-good node of this type has (``hostcheck baseline``); None: no section.
    baseline: Baseline | None = None


def _xid_from_data(path: Path) -> XidPolicy:
    """The shipped policy; as with the thresholds, a malformed file raises ValueError naming it, never a
    silent default (the window, for one, is written there only, beside its source)."""
    try:
        data = json.loads(path.read_text())
        window = data["window_hours"]
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0:
            raise ValueError("window_hours must be a positive number")
        sets: dict[str, set[int]] = {a: set() for a in XID_ACTIONS}
        meaning: dict[int, tuple[str, str]] = {}
        for row in data.get("xids", []):
            sets[row["action"]].add(int(row["xid"]))
            meaning[int(row["xid"])] = (row.get("meaning", ""), row.get("source", ""))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return XidPolicy(
        fail=frozenset(sets["fail"]),
        warn=frozenset(sets["warn"]),
        ignore=frozenset(sets["ignore"]),
        unlisted=data.get("unlisted", "warn"),
        window_hours=float(window),
        meaning=meaning,
    )


# ---------------------------------------------------------------------------------------------- loading


def add_option(parser: Any) -> None:
    """``--config PATH`` on a subcommand (or an argument group) that reads the file: one option, one help text."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML settings (default: {DEFAULT_PATH} when it exists); options given here win",
    )


def from_args(args: Any) -> Config:
    """The file ``--config`` names (then a missing file is an error), else the default file where it exists."""
    path = getattr(args, "config", None)
    return load(path, explicit=path is not None)


def toml_parser() -> Any:
    """The TOML parser: the standard library's tomllib (Python 3.11+), or on 3.9 and 3.10 tomli, the package
    tomllib was taken from (pyproject.toml's dependency there); None when neither is importable."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib  # same API: tomllib is tomli 1.2 moved into the standard library (PEP 680)
        except ImportError:
            return None
    return tomllib


#: Why a TOML file cannot be read on this Python, and the way out.
TOML_MISSING = (
    f"reading it needs tomllib (Python 3.11+) or the package tomli on Python {sys.version_info[0]}."
    f"{sys.version_info[1]}: pip install tomli, or run hostcheck with Python 3.11+ (gpunode_health's venv has one)"
)


def load(path: str | None, explicit: bool) -> Config:
    """The configuration at ``path`` (``--config``), or the default file when it exists.

    ``explicit``: the user named the file, so a missing one is an error; the default path may be absent.
    """
    path = path or DEFAULT_PATH
    if not explicit and not os.path.lexists(path):
        return Config()
    try:  # a regular file (a link the admin made is followed), at most 1 MiB, UTF-8 (TOML's own rule)
        raw = infile.read_text(path)
    except infile.ReadError as exc:
        raise ConfigError(path, "", f"cannot read it ({exc.why.removeprefix('is ')})") from None
    tomllib = toml_parser()
    if tomllib is None:
        # Judging with the defaults in place of the site's file could call a node ready that the file says is
        # not: a usage error that says what to do, never a silent fallback.
        raise ConfigError(path, "", TOML_MISSING + ", or name another file with --config")
    try:
        doc = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(path, "", "not valid TOML: nested too deeply") from None
    return parse(doc, path)


class _Table:
    """One TOML table being read: every key taken is remembered, leftovers are unknown keys."""

    def __init__(self, path: str, prefix: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise ConfigError(path, prefix, f"must be a table, not {_kind(value)}")
        self.path, self.prefix, self.value, self.taken = path, prefix, value, set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str, kinds: tuple[type, ...], what: str) -> Any:
        self.taken.add(name)
        if name not in self.value:
            return None
        v = self.value[name]
        if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
            raise ConfigError(self.path, self.key(name), f"must be {what}, not {_kind(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(self.path, self.key(name), f"must be {what}, not {v}")
        return v

    def number(self, name: str, lo: float, hi: float) -> float | None:
        v = self.get(name, (int, float), "a number")
        if v is not None and not lo <= v <= hi:
            if lo == math.ulp(0.0) and hi == math.inf:  # a threshold row without a range: any number above 0
                raise ConfigError(self.path, self.key(name), f"must be above 0, not {v}")
            raise ConfigError(self.path, self.key(name), f"must be from {lo:g} to {hi:g}, not {v}")
        return None if v is None else float(v)

    def integer(self, name: str, lo: int, hi: int) -> int | None:
        v = self.get(name, (int,), "an integer")
        if v is not None and not lo <= v <= hi:
            raise ConfigError(self.path, self.key(name), f"must be from {lo} to {hi}, not {v}")
        return v

    def string(self, name: str, choices: tuple[str, ...] | None = None) -> str | None:
        v = self.get(name, (str,), "a string")
        if v is not None and choices is not None and v not in choices:
            raise ConfigError(self.path, self.key(name), f"must be one of {', '.join(choices)}, not {v!r}")
        if v is not None and ("\x00" in v or "\n" in v):
            raise ConfigError(self.path, self.key(name), "must be one line of text")
        return v

    def strings(self, name: str) -> tuple[str, ...]:
        v = self.get(name, (list,), "a list of strings")
        if v is None:
            return ()
        if not all(isinstance(x, str) for x in v):
            raise ConfigError(self.path, self.key(name), "must be a list of strings")
        return tuple(v)

    def ints(self, name: str, lo: int, hi: int) -> frozenset[int] | None:
        v = self.get(name, (list,), "a list of integers")
        if v is None:
            return None
        bad = [x for x in v if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi]
        if bad:
            raise ConfigError(
                self.path, self.key(name), f"must be a list of integers {lo}-{hi}, not {bad[0]!r}"
            )
        return frozenset(v)

    def table(self, name: str) -> _Table | None:
        self.taken.add(name)
        if name not in self.value:
            return None
        return _Table(self.path, self.key(name), self.value[name])

    def done(self) -> None:
        unknown = sorted(set(self.value) - self.taken)
        if unknown:
            raise ConfigError(self.path, self.key(unknown[0]), "unknown key")


def _kind(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}.get(
        type(v), "a table" if isinstance(v, dict) else type(v).__name__
    )


def parse(doc: dict[str, Any], path: str = "<config>") -> Config:
    """A parsed TOML document as a Config; every key is checked, unknown keys are errors."""
    top = _Table(path, "", doc)
    profile = top.string("profile", tuple(PROFILES))
    expect_gpus = top.integer("expect_gpus", 0, 1024)
    fail_level = top.string("fail_level", tuple(FAIL_LEVELS))
    min_score = top.integer("min_score", 0, 100)

    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    checks = top.table("checks")
    if checks is not None:
        only, skip = checks.strings("only"), checks.strings("skip")
        checks.done()

    node_lines, job_lines = _thresholds(top.table("thresholds"), path)

    xid = _xid(top.table("xid"), path)
    models = _models(top, path)

    slurm = SlurmSettings()
    s = top.table("slurm")
    if s is not None:
        drain = s.get("drain", (bool,), "true or false")
        node = s.string("node")
        prefix = s.string("reason_prefix")
        scontrol = s.string("scontrol")
        s.done()
        if node is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", node):
            raise ConfigError(path, "slurm.node", f"not a Slurm node name: {node!r}")
        if prefix is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,23}", prefix):
            raise ConfigError(path, "slurm.reason_prefix", "1-24 letters, digits, '.', '_' or '-'")
        if scontrol is not None and not scontrol.strip():
            raise ConfigError(path, "slurm.scontrol", "must not be empty")
        slurm = SlurmSettings(
            drain=bool(drain),
            node=node or "",
            reason_prefix=prefix or slurm.reason_prefix,
            scontrol=scontrol or slurm.scontrol,
        )

    prometheus = None
    p = top.table("prometheus")
    if p is not None:
        prometheus = p.string("textfile")
        p.done()
        if prometheus is not None and not prometheus.startswith("/"):
            raise ConfigError(path, "prometheus.textfile", "must be an absolute path")
    hardware = _hardware(top.table("hardware"), path)
    fabric = _fabric(top.table("fabric"), path)
    baseline = _baseline(top.table("baseline"), path)
    top.done()
    return Config(
        path=path,
        profile=profile,
        expect_gpus=expect_gpus,
        fail_level=fail_level,
        min_score=min_score,
        only=only,
        skip=skip,
        thresholds=node_lines,
        job_thresholds=job_lines,
        xid=xid,
        gpu_models=models,
        slurm=slurm,
        prometheus=prometheus,
        hardware=hardware,
        fabric=fabric,
        baseline=baseline,
    )


def _fabric(f: _Table | None, path: str) -> FabricSettings:
    if f is None:
        return FabricSettings()
    flat = dict(
        expected_ports=f.integer("expected_ports", 0, 1024),
        rate_gbps=f.number("rate_gbps", 1, 100000),
        link_layer=f.string("link_layer", LINK_LAYERS),
    )
    max_distance = f.string("max_distance", DISTANCES)
    users = f.strings("nccl_users")
    bad = [u for u in users if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?", u)]
    if bad:
        raise ConfigError(path, "fabric.nccl_users", f"not a user name: {bad[0][:40]!r}")
    raw = f.get("ports", (list,), "an array of tables ([[fabric.ports]])") or []
    if len(raw) > 64:
        raise ConfigError(path, "fabric.ports", "more than 64 port classes")
    classes = []
    for i, item in enumerate(raw):
        t = _Table(path, f"fabric.ports[{i}]", item)
        name = t.string("name")
        devices = t.strings("devices")
        role = t.string("role", PORT_ROLES) or ANY_ROLE
        count = t.integer("count", 0, 1024)
        rate = t.number("rate_gbps", 1, 100000)
        layer = t.string("link_layer", LINK_LAYERS)
        t.done()
        if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,31}", name):
            raise ConfigError(path, t.key("name"), "is required: 1-32 letters, digits, ' ', '.', '_' or '-'")
        if len(devices) > 64 or any(not re.fullmatch(r"[A-Za-z0-9_.*?\[\]!-]{1,64}", d) for d in devices):
            raise ConfigError(path, t.key("devices"), "must be up to 64 device names or globs (mlx5_*)")
        if count is None and rate is None and layer is None:
            raise ConfigError(
                path, t.key("name"), "the class sets nothing: give count, rate_gbps or link_layer"
            )
        if role == RAIL and any(v is not None for v in flat.values()):
            raise ConfigError(
                path, t.key("role"), "the rails are set by [fabric]'s flat keys already: set them once"
            )
        classes.append(PortClass(name, tuple(devices), role, count, rate, layer))
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ConfigError(path, "fabric.ports", "two port classes have the same name")
    f.done()
    return FabricSettings(
        **flat, max_distance=max_distance, ports=tuple(classes), nccl_users=tuple(dict.fromkeys(users))
    )


def _baseline(t: _Table | None, path: str) -> Baseline | None:
    if t is None:
        return None
    big = 1 << 62
    out: dict[str, Any] = {
        "recorded_on": t.string("recorded_on"),
        "recorded_at": t.string("recorded_at"),
        "cpu_model": t.string("cpu_model"),
        "cpu_sockets": t.integer("cpu_sockets", 1, 1024),
        "cpu_cores": t.integer("cpu_cores", 1, 1 << 20),
        "cpu_threads": t.integer("cpu_threads", 1, 1 << 20),
        "memory_bytes": t.integer("memory_bytes", 1, big),
    }
    numa = t.get("numa_cpus", (list,), "a list of CPU lists")
    if numa is not None:
        if (
            not all(isinstance(x, str) and re.fullmatch(r"[0-9,\-]{0,4096}", x) for x in numa)
            or len(numa) > 4096
        ):
            raise ConfigError(path, t.key("numa_cpus"), 'must be a list of CPU lists such as "0-55,112-167"')
        out["numa_cpus"] = tuple(numa)
    for name, fields in BASELINE_LISTS.items():
        items = t.get(name, (list,), "an array of tables")
        if items is None:
            continue
        if len(items) > BASELINE_MAX_ITEMS:
            raise ConfigError(path, t.key(name), f"more than {BASELINE_MAX_ITEMS} entries")
        rows = []
        for i, item in enumerate(items):
            row = _Table(path, f"{t.key(name)}[{i}]", item)
            values = []
            for field_name, (kinds, what) in fields.items():
                v = row.get(field_name, kinds, what)
                if v is None:
                    raise ConfigError(path, row.key(field_name), "is required")
                if isinstance(v, str) and ("\x00" in v or "\n" in v or len(v) > 256):
                    raise ConfigError(path, row.key(field_name), "must be one line of text")
                if not isinstance(v, str) and not 0 <= v <= big:
                    raise ConfigError(path, row.key(field_name), f"must be from 0 to {big}, not {v}")
                values.append(float(v) if float in kinds else v)
            for field_name, choices in BASELINE_OPTIONAL.get(name, {}).items():
                v = row.string(field_name, choices or None) or ""
                if (
                    field_name == "gpu"
                    and v
                    and not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", v)
                ):
                    raise ConfigError(
                        path, row.key(field_name), f"not a PCI address (0000:18:00.0): {v[:40]!r}"
                    )
                values.append(v)
            row.done()
            rows.append(tuple(values))
        out[name] = tuple(rows)
    t.done()
    return Baseline(**out)


def _thresholds(t: _Table | None, path: str) -> tuple[Any, Any]:
    """[thresholds]: any row of the thresholds files by name, of its type (an integer where the row counts) and
    within the row's range; an unknown name is an unknown key."""
    node, job = Thresholds(), JobThresholds()
    if t is None:
        return node, job
    for name, why in RETIRED_THRESHOLDS.items():
        if name in t.value:
            raise ConfigError(path, t.key(name), f"retired: {why}; remove it")
    given: dict[str, Any] = {}
    for name, row in thresholds.ROWS.items():
        if row.kind is int:
            v = t.integer(name, int(row.low), int(row.high) if math.isfinite(row.high) else 1 << 62)
        else:
            v = t.number(name, row.low, row.high)
        if v is not None:
            given[name] = v
    t.done()
    node = dataclasses.replace(node, **{k: v for k, v in given.items() if k in thresholds.NODE_ROWS})
    job = dataclasses.replace(job, **{k: v for k, v in given.items() if k in thresholds.JOB_ROWS})
    if node.gpu_temp_warn_c > node.gpu_temp_fail_c:
        raise ConfigError(path, "thresholds.gpu_temp_warn_c", "must not be above gpu_temp_fail_c")
    return node, job


def _hardware(t: _Table | None, path: str) -> HardwareSettings:
    if t is None:
        return HardwareSettings()
    state_file = t.string("state_file")
    mig = t.string("mig", MIG_EXPECT)
    graphics = t.integer("app_clock_graphics_mhz", 1, 100000)
    memory = t.integer("app_clock_memory_mhz", 1, 100000)
    t.done()
    if state_file is not None and not state_file.startswith("/"):
        raise ConfigError(path, "hardware.state_file", "must be an absolute path")
    if (graphics is None) != (memory is None):
        raise ConfigError(path, "hardware.app_clock_graphics_mhz", "set both application clocks or neither")
    clocks = (graphics, memory) if graphics is not None and memory is not None else None
    return HardwareSettings(state_file=state_file, mig=mig or "same", app_clocks_mhz=clocks)


def _xid(t: _Table | None, path: str) -> XidPolicy:
    base = default_xid_policy()
    if t is None:
        return base
    lists = {a: t.ints(a, 0, 100000) for a in XID_ACTIONS}
    unlisted = t.string("unlisted", XID_ACTIONS)
    window = t.number("window_hours", 0.01, 24 * 30)
    t.done()
    for a in XID_ACTIONS:
        for b in XID_ACTIONS:
            if a < b and lists[a] and lists[b] and lists[a] & lists[b]:
                both = sorted(lists[a] & lists[b])[0]
                raise ConfigError(path, f"xid.{b}", f"Xid {both} is also in xid.{a}")
    # A site's list replaces nothing else: an XID it names moves to that action, the rest keep the defaults.
    named = set().union(*(v for v in lists.values() if v))
    sets = {a: (getattr(base, a) - named) | (lists[a] or frozenset()) for a in XID_ACTIONS}
    return XidPolicy(
        fail=frozenset(sets["fail"]),
        warn=frozenset(sets["warn"]),
        ignore=frozenset(sets["ignore"]),
        unlisted=unlisted or base.unlisted,
        window_hours=base.window_hours if window is None else window,
        meaning=base.meaning,
    )


def _models(top: _Table, path: str) -> tuple[GpuModel, ...]:
    raw = top.get("gpu_models", (list,), "an array of tables ([[gpu_models]])")
    out = []
    for i, item in enumerate(raw or []):
        m = _Table(path, f"gpu_models[{i}]", item)
        match = m.string("match")
        name = m.string("name")
        figures = {d: m.number(f"{d}_tflops", 0.001, 100000) for d in DTYPES}
        copy = m.number("copy_gbs", 0.001, 1000000)
        m.done()
        if not match:
            raise ConfigError(path, m.key("match"), "is required (a regular expression on the GPU name)")
        try:
            re.compile(match)
        except re.error as exc:
            raise ConfigError(path, m.key("match"), f"not a regular expression: {exc}") from None
        out.append(
            GpuModel(
                match=match,
                name=name or match,
                matmul_tflops={d: v for d, v in figures.items() if v is not None},
                copy_gbs=copy,
            )
        )
    return tuple(out)
