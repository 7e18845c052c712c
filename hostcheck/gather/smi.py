"""Fallback when nvidia-ml-py is not installed: the same per-GPU data read through ``nvidia-smi`` CSV queries.

nvidia-smi ships with every driver, so a node whose Python lacks nvidia-ml-py is still judged. A field this
driver's nvidia-smi does not know makes the whole query fail ("... is not a valid field to query"), so such a
field is dropped and the query retried; it then reads as not supported.
"""

from __future__ import annotations

import re
from typing import Any

from hostcheck.gather.base import (
    ERROR,
    GPU_LOST,
    NO_PERMISSION,
    NOT_INSTALLED,
    NOT_SUPPORTED,
    CmdResult,
    Runner,
    Unavailable,
    parse_int,
    read_text,
    run_cmd,
)
from hostcheck.gather.gpuinfo import GpuInfo, GpuProcess, NvmlSnapshot, normalise_bus_id

GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "memory.total",
    "ecc.mode.current",
    "ecc.mode.pending",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "clocks_event_reasons.active",
    "temperature.gpu",
    "persistence_mode",
    "mig.mode.current",
)
#: Older drivers know the throttle name only.
FIELD_ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
REMAP_FIELDS = (
    "gpu_bus_id",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
APP_FIELDS = ("gpu_bus_id", "pid", "process_name", "used_memory")

_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field', re.IGNORECASE)
#: What nvidia-smi prints, in place of a GPU's row, for a GPU whose NVML handle it cannot get (the GPU fell off the
#: bus: NVIDIA/open-gpu-kernel-modules#387, fixed by reseating it); it goes on with the other GPUs.
_NO_HANDLE = re.compile(
    r"Unable to determine the device handle for GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f:.]+): (.{1,200})"
)
#: The key a lost GPU's row carries in :func:`query`'s answer instead of its fields.
LOST = "__lost__"


def cell(raw: str) -> Any:
    """A CSV cell: '[N/A]' / '[Not Supported]' and the bracketed errors become Unavailable."""
    v = raw.strip()
    if not (v.startswith("[") and v.endswith("]")):
        return v
    low = v.lower()
    if "not supported" in low or "n/a" in low:
        return Unavailable(NOT_SUPPORTED, "not supported on this GPU")
    if "requires reset" in low:
        return Unavailable(GPU_LOST, "the GPU requires a reset (nvidia-smi: [GPU requires reset])")
    if "lost" in low:
        return Unavailable(GPU_LOST, v.strip("[]"))
    if "permission" in low:
        return Unavailable(NO_PERMISSION, "insufficient permissions (run as root)")
    return Unavailable(ERROR, v.strip("[]"))


def _int(v: Any) -> Any:
    if isinstance(v, Unavailable):
        return v
    try:
        word = str(v).split()[0]
        if not word.isascii():  # int() reads "٣" as 3: not a number nvidia-smi writes
            raise ValueError(word)
        return int(word, 0)  # base 0: also '0x0000000000000001'
    except (ValueError, IndexError):
        return Unavailable(ERROR, f"unparsable {v!r}")


def _flag(v: Any) -> Any:
    if isinstance(v, Unavailable):
        return v
    s = str(v).strip().lower()
    if s in ("enabled", "yes", "true", "on", "active"):
        return True
    if s in ("disabled", "no", "false", "off", "none", ""):
        return False
    try:
        return int(s) != 0
    except ValueError:
        return Unavailable(ERROR, f"unparsable {v!r}")


def smi_error(text: str) -> Unavailable:
    low = text.lower()
    if "mismatch" in low:
        return Unavailable(ERROR, "driver/library version mismatch (kernel module and libnvidia-ml differ)")
    if "couldn't communicate with the nvidia driver" in low or "driver not loaded" in low:
        return Unavailable(NOT_INSTALLED, "NVIDIA driver not loaded (nvidia-smi cannot reach it)")
    if "no devices were found" in low:
        return Unavailable(ERROR, "nvidia-smi: no devices were found")
    return Unavailable(ERROR, "nvidia-smi: " + (text.strip().splitlines() or ["failed"])[-1][:200])


def lost_rows(text: str) -> list[dict[str, Any]]:
    """The GPUs nvidia-smi could not get a handle for, each as a row of its bus id and why it is lost."""
    out = []
    for m in _NO_HANDLE.finditer(text):
        bus = normalise_bus_id(m.group(1))
        why = m.group(2).strip()
        out.append(
            {
                "pci.bus_id": m.group(1),
                LOST: Unavailable(
                    GPU_LOST,
                    f"GPU {bus} lost: NVML cannot get its handle ({why}); reset it, and reseat it if it stays lost",
                ),
            }
        )
    return out


def query(
    runner: Runner, kind: str, fields: tuple[str, ...]
) -> tuple[list[dict[str, Any]], Unavailable | None]:
    """Run ``nvidia-smi --query-<kind>=fields``; drop fields this driver does not know, retry. A GPU nvidia-smi
    cannot reach is a row holding :data:`LOST` (where it stands among the others), not a failed query."""
    fields = tuple(fields)
    for _attempt in range(6):
        r = runner(["nvidia-smi", f"--query-{kind}={','.join(fields)}", "--format=csv,noheader,nounits"], 30)
        if isinstance(r, Unavailable):
            return [], r
        out = r.stdout + r.stderr
        bad = _INVALID_FIELD.search(out)
        if r.rc != 0 and bad and bad.group(1) in fields:
            name = bad.group(1)
            alias = FIELD_ALIASES.get(name)
            fields = tuple(alias if f == name and alias else f for f in fields if f != name or alias)
            continue
        lost = lost_rows(out)
        if r.rc != 0 and not lost:
            return [], smi_error(out)
        rows = []
        for line in r.stdout.splitlines():
            if not line.strip():
                continue
            gone = lost_rows(line)
            if gone:
                rows += gone
                continue
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != len(fields):  # a name with a comma: join the overflow into the name column
                extra = len(cells) - len(fields)
                if extra > 0 and "name" in fields:
                    i = fields.index("name")
                    cells[i : i + extra + 1] = [",".join(cells[i : i + extra + 1])]
            rows.append(dict(zip(fields, (cell(c) for c in cells))))
        said = {str(r["pci.bus_id"]) for r in rows if LOST in r}
        rows += [r for r in lost if str(r["pci.bus_id"]) not in said]  # printed on stderr
        return rows, None
    return [], Unavailable(ERROR, "nvidia-smi rejected the query fields")


def _field(row: dict[str, Any], name: str) -> Any:
    if name in row:
        return row[name]
    alias = FIELD_ALIASES.get(name)
    if alias and alias in row:
        return row[alias]
    return Unavailable(NOT_SUPPORTED, f"nvidia-smi field {name} unknown to this driver")


def _mig(v: Any) -> Any:
    """nvidia-smi's mig.mode.current ("Enabled", "Disabled", "[N/A]") as NVML's (current, pending) pair; the
    pending half is not read here and repeats the current one."""
    on = _flag(v)
    return on if isinstance(on, Unavailable) else (int(on), int(on))


def parse_cuda_version(text: str) -> int | None:
    m = re.search(r"CUDA Version\s*:?\s*(\d+)\.(\d+)", text)
    return int(m.group(1)) * 1000 + int(m.group(2)) * 10 if m else None


def gather_smi(runner: Runner = run_cmd) -> NvmlSnapshot:
    rows, err = query(runner, "gpu", GPU_FIELDS)
    if err is not None:
        return NvmlSnapshot(error=err, source="nvidia-smi")
    remap_rows, remap_err = query(runner, "remapped-rows", REMAP_FIELDS)
    app_rows, app_err = query(runner, "compute-apps", APP_FIELDS)
    head = runner(["nvidia-smi"], 30)
    cuda = parse_cuda_version(head.stdout) if isinstance(head, CmdResult) else None
    remaps = {
        normalise_bus_id(str(r["gpu_bus_id"])): r
        for r in remap_rows
        if LOST not in r and isinstance(r.get("gpu_bus_id"), str)
    }
    apps: dict[str, list[GpuProcess]] = {}
    for a in app_rows:
        if isinstance(a.get("gpu_bus_id"), str) and isinstance(_int(a.get("pid")), int):
            mem = _int(a.get("used_memory"))
            apps.setdefault(normalise_bus_id(a["gpu_bus_id"]), []).append(
                GpuProcess(
                    pid=_int(a["pid"]),
                    name=str(a.get("process_name", "?")).rsplit("/", 1)[-1],
                    used_bytes=mem * (1 << 20) if isinstance(mem, int) else None,
                )
            )
    gpus = []
    driver: Any = Unavailable(ERROR, "no GPU rows")
    for i, row in enumerate(rows):
        bus = row.get("pci.bus_id")
        bus_id = normalise_bus_id(bus) if isinstance(bus, str) else bus
        if LOST in row:
            gpus.append(GpuInfo(index=i, pci_bus_id=bus_id, handle_error=row[LOST]))
            continue
        driver = row.get("driver_version", driver)
        cap = _field(row, "compute_cap")
        if isinstance(cap, str):
            try:
                major, minor = cap.split(".", 1)
                cap = (int(major), int(minor))
            except ValueError:
                cap = Unavailable(ERROR, f"unparsable compute_cap {cap!r}")
        mem = _int(_field(row, "memory.total"))
        rr: Any = remap_err or Unavailable(NOT_SUPPORTED, "row remapping not reported")
        if isinstance(bus_id, str) and bus_id in remaps:
            r = remaps[bus_id]
            vals = [r.get(f, Unavailable(NOT_SUPPORTED, f"{f} not reported")) for f in REMAP_FIELDS[1:]]
            parsed = (_int(vals[0]), _int(vals[1]), _flag(vals[2]), _flag(vals[3]))
            # A cell that is not a number or a flag leaves the remap state unknown, never a failed remap.
            rr = next((v for v in parsed if isinstance(v, Unavailable)), None) or parsed
        numa: Any = Unavailable(NOT_SUPPORTED, "no NUMA node in sysfs")
        if isinstance(bus_id, str):
            t = read_text(f"/sys/bus/pci/devices/{bus_id}/numa_node")
            if parse_int(t, signed=True) is not None:
                numa = parse_int(t, signed=True)
        idx = _int(row.get("index", str(i)))
        # A GPU that answers "[GPU requires reset]" (or "[GPU is lost]") in any cell is lost as a whole.
        lost = next((v for v in row.values() if isinstance(v, Unavailable) and v.kind == GPU_LOST), None)
        gpus.append(
            GpuInfo(
                index=idx if isinstance(idx, int) else i,
                name=_field(row, "name"),
                uuid=_field(row, "uuid"),
                pci_bus_id=bus_id,
                compute_capability=cap,
                memory_total_bytes=mem * (1 << 20) if isinstance(mem, int) else mem,
                ecc_current=_flag(_field(row, "ecc.mode.current")),
                ecc_pending=_flag(_field(row, "ecc.mode.pending")),
                ecc_uncorrected_volatile=_int(_field(row, "ecc.errors.uncorrected.volatile.total")),
                ecc_uncorrected_aggregate=_int(_field(row, "ecc.errors.uncorrected.aggregate.total")),
                remapped_rows=rr,
                retired_pages_dbe=_int(_field(row, "retired_pages.double_bit.count")),
                retired_pages_sbe=_int(_field(row, "retired_pages.single_bit_ecc.count")),
                retired_pages_pending=_flag(_field(row, "retired_pages.pending")),
                pcie_gen_current=_int(_field(row, "pcie.link.gen.current")),
                pcie_gen_max=_int(_field(row, "pcie.link.gen.max")),
                pcie_width_current=_int(_field(row, "pcie.link.width.current")),
                pcie_width_max=_int(_field(row, "pcie.link.width.max")),
                clock_event_reasons=_int(_field(row, "clocks_event_reasons.active")),
                temperature_c=_int(_field(row, "temperature.gpu")),
                slowdown_temperature_c=Unavailable(NOT_SUPPORTED, "not read through nvidia-smi"),
                persistence_mode=_flag(_field(row, "persistence_mode")),
                numa_node=numa,
                processes=app_err or tuple(apps.get(bus_id, ())) if isinstance(bus_id, str) else (),
                mig_mode=_mig(_field(row, "mig.mode.current")),
                handle_error=lost,
            )
        )
    return NvmlSnapshot(
        error=None,
        driver_version=driver,
        cuda_driver_version=cuda
        if cuda is not None
        else Unavailable(ERROR, "CUDA version not in nvidia-smi"),
        nvml_version=Unavailable(NOT_SUPPORTED, "read through nvidia-smi"),
        device_count=len(gpus),
        gpus=tuple(gpus),
        source="nvidia-smi",
    )
