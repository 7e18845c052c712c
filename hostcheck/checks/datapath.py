"""system.E005, the dataset storage: SSD, free space and read rate of the dataset directories (a module of its own,
so that only the profiles that read those directories load their gatherer)."""

from __future__ import annotations

from typing import Any

from hostcheck.checks.gpu import _config
from hostcheck.gather.base import Unavailable
from hostcheck.gather.datapath import BlockDevice, ReadMeasure
from hostcheck.registry import Outcome, check, errored, failed, passed, skipped, warned


def _gb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.0f} GB"


def _data_gpus(s: Any) -> int:
    if s.nvml is not None and s.nvml.ok and s.nvml.gpus:
        return len(s.nvml.gpus)
    if s.options.expect_gpus:
        return s.options.expect_gpus
    try:
        return max(1, int(s.facts.get("gpunode_driver", "expected_gpu_count") or 1))
    except (TypeError, ValueError):
        return 1


@check(
    "system.E005",
    "Dataset storage: SSD, free space, reads",
    weight=2,
    needs=("datapath", "facts"),
)
def dataset_storage(s: Any) -> Outcome:
    dp = s.datapath
    if dp is None or (dp.error is None and not dp.dirs):
        return skipped(
            "no dataset directory named: pass --data-dir DIR, or record data_dirs in gpunode_tuning.fact "
            "(docs/design.md)"
        )
    if dp.error is not None:
        return errored(f"dataset storage: {dp.error.reason}", hint="re-run with a longer --timeout")
    gpus = _data_gpus(s)
    th = _config(s).thresholds
    if s.options.data_rate_mb_s:
        need, need_src = float(s.options.data_rate_mb_s), "--data-rate"
    else:
        need = th.data_read_need_mb_s_per_gpu * gpus
        need_src = f"{th.data_read_need_mb_s_per_gpu:g} MB/s per GPU x {gpus} (ResNet-50 on ImageNet, docs/hostcheck.md)"
    details, missing, slow, rotating, full, unmeasured = [], [], [], [], [], []
    rates = []
    for d in dp.dirs:
        if d.error is not None:
            missing.append(d.error.reason)
            details.append(d.error.reason)
            continue
        dev = d.device
        if isinstance(dev, BlockDevice):
            kind = {True: "rotational (HDD)", False: "non-rotational (SSD/NVMe)", None: "rotation unknown"}
            where = f"{d.fstype} on {dev.name} ({', '.join(dev.disks)}: {kind[dev.rotational]})"
            if dev.rotational:
                rotating.append(d.path)
        else:
            reason = dev.reason if isinstance(dev, Unavailable) else "no mount found"
            where = f"{d.fstype or '?'} from {d.source or '?'} ({reason})"
        share = d.free_bytes / d.total_bytes if d.free_bytes is not None and d.total_bytes else None
        room = f"{_gb(d.free_bytes)} free of {_gb(d.total_bytes)}" + (
            f" ({share:.0%})" if share is not None else ""
        )
        if share is not None and share < th.data_free_warn_fraction:
            full.append(d.path)
        r = d.read
        if isinstance(r, ReadMeasure) and r.mb_s is not None:
            rates.append(r.mb_s)
            read = f"read {r.mb_s:.0f} MB/s ({r.method}, {r.files} files, {r.readers} readers)"
            if r.mb_s < need:
                slow.append(f"{d.path} {r.mb_s:.0f} MB/s")
        else:
            why = r.reason if isinstance(r, Unavailable) else "not measured"
            read = f"read not measured: {why}"
            unmeasured.append(d.path)
        details.append(f"{d.path}: {where}; {room}; {read}")
    if dp.busy:
        details.append(f"measured while {dp.busy}: the reads competed with it")
    kw: dict[str, Any] = {
        "value": round(min(rates), 1) if rates else None,
        "unit": "MB/s",
        "expected": f">= {need:.0f} MB/s ({need_src}); non-rotational; >= {th.data_free_warn_fraction:.0%} free",
        "details": tuple(details),
    }
    move = (
        "put the dataset on local NVMe/SSD (or stage it there from network storage before the job), "
        "or pack small files into shards (WebDataset, tar) that read sequentially"
    )
    if missing:
        return failed(
            "; ".join(missing), hint="fix the path (--data-dir, or data_dirs in gpunode_tuning.fact)", **kw
        )
    if slow:
        return failed(
            f"dataset reads too slow for the pipeline: {', '.join(slow)} < {need:.0f} MB/s", hint=move, **kw
        )
    if rotating:
        return warned(f"dataset on a rotational disk: {', '.join(rotating)}", hint=move, **kw)
    if full:
        return warned(
            f"less than {th.data_free_warn_fraction:.0%} free under {', '.join(full)}",
            hint="free space or move the dataset to a larger file system",
            **kw,
        )
    if unmeasured and not rates:
        return passed(f"dataset storage non-rotational with room; reads not measured ({dp.source})", **kw)
    return passed(f"dataset storage fast enough: slowest {min(rates):.0f} MB/s >= {need:.0f} MB/s", **kw)
