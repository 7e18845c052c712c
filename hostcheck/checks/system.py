"""System checks: OS, kernel headers for DKMS, the training Python's version, local facts, the last pull-mode run
(the dataset storage check, system.E005, is hostcheck.checks.datapath: only a run that reads the dataset
directories loads it)."""

from __future__ import annotations

from typing import Any

from hostcheck import fixes, platform
from hostcheck.checks.gpu import _config
from hostcheck.gather.base import Unavailable
from hostcheck.gather.pull import DEFAULT_UNIT
from hostcheck.progress import duration
from hostcheck.registry import Outcome, check, failed, passed, skipped, warned


@check("system.E001", "Operating system supported by the roles", weight=1, needs=("system",))
def os_supported(s: Any) -> Outcome:
    """The roles' own table (hostcheck/data/platform.json, which gpunode_base's plan reads through the same
    hostcheck/platform.py): an OS the roles refuse (end of life, not yet supported) is said with their reason."""
    sysm = s.system
    name = sysm.os_pretty or f"{sysm.os_id} {sysm.os_version}"
    value = f"{name}, kernel {sysm.kernel}, {sysm.arch}"
    data = platform.load()
    key, row = platform.os_row_for(data, sysm.os_id, sysm.os_version)
    expected = ", ".join(platform.supported_os(data))
    if row and row.get("supported"):
        return passed(value, value=value, expected=expected)
    if row:  # a row the roles refuse, with why (an end of life and its date, per-OS facts not checked yet)
        why = str(row.get("why") or "not supported")
        return warned(
            f"{name}: the gpunode roles refuse {key}: {why}",
            value=value,
            expected=expected,
            hint=f"move the node to a supported OS ({expected}); docs/platform.md",
            brief=f"{key} refused by the roles",
        )
    return warned(
        f"{name} is not a distribution the gpunode roles support",
        value=value,
        expected=expected,
        hint="use a supported distribution (docs/platform.md); other ones may work but are untested",
        brief=f"{sysm.os_id} {sysm.os_version} not supported",
    )


@check("system.E002", "Kernel headers for the running kernel (DKMS)", weight=2, needs=("system",))
def kernel_headers(s: Any) -> Outcome:
    sysm = s.system
    if sysm.container:
        return skipped(f"in a {sysm.container} container: the host's kernel builds the driver")
    if sysm.kernel_build_dir:
        return passed(f"/lib/modules/{sysm.kernel}/build present", value=sysm.kernel)
    return warned(
        f"no /lib/modules/{sysm.kernel}/build: DKMS cannot rebuild the NVIDIA module after a kernel update",
        value=sysm.kernel,
        expected="headers installed",
        hint=f"install linux-headers-{sysm.kernel} (Debian/Ubuntu) or kernel-devel-{sysm.kernel} (EL), or "
        + fixes.rerun(fixes.DRIVER, "driver"),
    )


@check("system.E003", "Training Python version", weight=1, needs=("system", "torch"))
def python_version(s: Any) -> Outcome:
    t = s.torch
    if t is None or t.error is not None or "python" not in t.data:
        return skipped("training Python not probed (see torch.E001)")
    v = t.data["python"]
    parts = tuple(int(x) for x in v.split(".")[:2] if x.isdigit())
    if parts < (3, 9):
        return failed(
            f"Python {v} at {t.python} is too old for current torch",
            value=v,
            expected=">= 3.9",
            hint=fixes.rerun(fixes.PYTORCH, "pytorch") + " to rebuild the venv with a newer Python",
        )
    return passed(f"Python {v} at {t.python}", value=v, expected=">= 3.9")


@check("system.E004", "gpunode local facts", weight=1, needs=("facts",))
def local_facts(s: Any) -> Outcome:
    f = s.facts
    found = sorted(f.roles)
    if f.errors or f.invalid:
        bad = "; ".join([*(u.reason for u in f.errors.values()), *f.invalid])
        what = "unreadable local facts" if f.errors else "wrong values in local facts (ignored)"
        return warned(
            f"{what}: {bad}",
            value=", ".join(found) or None,
            hint="re-run " + fixes.PLAYBOOK + " to rewrite them (executable .fact scripts are not read)",
        )
    if not found:
        return warned(
            f"no gpunode_*.fact in {f.directory}: not provisioned by the gpunode roles (or another --facts-dir); "
            "intent-vs-reality comparisons are skipped",
            value=None,
            hint=f"provision the node with {fixes.PLAYBOOK}, or pass --facts-dir DIR",
        )
    return passed(f"{', '.join(found)} in {f.directory}", value=", ".join(found))


@check("system.E011", "Pull-mode provisioning: the last ansible-pull run", weight=1, needs=("facts",))
def pull_run(s: Any) -> Outcome:
    """gpunode_pull's service writes each run's result (roles/gpunode_pull); its local fact says where, and the
    timer's interval. A failed or missed pull only warns: the node may still be provisioned as it should be."""
    f = s.facts
    fact = f.roles.get("gpunode_pull")
    if fact is None:
        if "gpunode_pull" in f.errors:
            return skipped(
                f"pull mode's local fact is unreadable (system.E004): {f.errors['gpunode_pull'].reason}"
            )
        return skipped("pull mode not set up on this node (no gpunode_pull local fact)")
    state = f.pull
    if state is None:
        return skipped("gpunode_pull's local fact names no result file (system.E004)")
    unit = fact.get("unit") or DEFAULT_UNIT
    journal = f"journalctl -u {unit}"
    run = state.run
    if isinstance(run, Unavailable):
        return warned(
            f"the last pull's result is unusable: {run.reason}",
            hint=f"see the last runs in '{journal}'; the next run rewrites {state.path} (systemctl start {unit})",
            brief="pull result unreadable",
        )
    interval = fact.get("interval_s") or (run.interval_s if run else None)
    n = _config(s).thresholds.pull_stale_intervals
    limit = n * interval if interval else None
    expected = f"a successful run within {n:g} x {duration(interval)}" if interval else "a successful run"
    timer = f"is the timer on? systemctl list-timers {unit.removesuffix('.service')}.timer; {journal}"
    if run is None:
        age = state.setup_age_s
        if limit is not None and age is not None and age > limit:
            return warned(
                f"no pull run has finished since pull mode was set up {duration(age)} ago",
                value=round(age),
                unit="s",
                expected=expected,
                hint=timer,
                brief=f"no pull finished in {duration(age)}",
            )
        return skipped("pull mode is set up but no run has finished yet (the first one may be under way)")
    last = (
        f"last success {duration(run.success_age_s)} ago" if run.success_age_s is not None else "none so far"
    )
    what = f"{run.ref or '?'}" + (f" ({run.commit[:12]})" if run.commit else "")
    if not run.ok:
        recap = f", {run.recap.get('failed', 0)} task(s) failed" if run.recap else ""
        return warned(
            f"the last pull of {what} failed {duration(run.age_s)} ago in its {run.stage} stage "
            f"(exit {run.rc}{recap}): {run.message or 'no message'}; {last}",
            value=run.rc,
            expected=expected,
            hint=f"see why in '{journal}' (and {run.log or 'the run log'}); fix the release or the node's pin "
            f"(gpunode_pull_ref), then systemctl start {unit}",
            brief=f"pull failed: {run.stage} exit {run.rc}",
            details=tuple(f"{k}={v}" for k, v in sorted((run.recap or {}).items())),
        )
    if limit is not None and run.age_s > limit:
        return warned(
            f"the last pull of {what} succeeded, but {duration(run.age_s)} ago: more than {n:g} intervals of "
            f"{duration(interval)}",
            value=round(run.age_s),
            unit="s",
            expected=expected,
            hint=timer,
            brief=f"pull stale: {duration(run.age_s)} ago",
        )
    note = "" if limit is not None else " (no interval recorded: its age is not judged)"
    return passed(
        f"the last pull of {what} succeeded {duration(run.age_s)} ago{note}",
        value=round(run.age_s),
        unit="s",
        expected=expected,
    )
