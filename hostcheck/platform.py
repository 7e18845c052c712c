"""The platform facts (hostcheck/data/platform.json) and the one decision made from them per node.

Why one module: the roles' filter plugin loads this file by path on the controller (no hostcheck installed
there), so the plan and everything it uses must be one file; hostcheck imports the same file. Standard library only. The data
holds the facts, each row with its public source; this module holds the logic:

- ``load(overrides)``: the data, with a site's corrections or new rows merged in (inventory
  ``gpunode_platform_overrides``);
- ``node_plan(...)``: from the node's OS, its GPUs (PCI device ids), the driver settings and the torch
  settings, choose torch's CUDA variant first; the driver branch and kernel-module flavour, the CUDA
  toolkit, cuDNN and NCCL follow it. Never raises for bad input: every refusal is an error string
  that names the nearest working choice.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).resolve().parent / "data" / "platform.json"
CPU = "cpu"
POLICIES = ("compat", "toolkit")
# Variant roles in the order "auto" prefers them (after the release's default build); experimental and extra builds
# (e.g. a Linux-only build whose architectures are unpublished) are installed only when named.
AUTO_ROLES = ("stable", "legacy")

_cache: dict[str, Any] | None = None


# --- small parsers -------------------------------------------------------------------------------


# PEP 440's version syntax (its appendix regex, less epoch and local labels, which these versions never carry in an
# order that matters): release, then pre (a|b|rc), post and dev segments, in any of their spellings.
_PEP440 = re.compile(
    r"(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>\d+)?)?"
    r"(?P<post>-(?P<post_n1>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n2>\d+)?)?"
    r"(?P<dev>[-_.]?dev[-_.]?(?P<dev_n>\d+)?)?",
    re.IGNORECASE,
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_RELEASE_WIDTH = 8  # release segments compared after padding with zeros (PEP 440: 2.11 == 2.11.0)
_ABSENT = 10**9  # a release without .devN sorts after its dev releases


def vtuple(version: Any) -> tuple[int, ...]:
    """A sort key in PEP 440 order: '2.11.0.dev1' < '2.11.0a1' < '2.11.0b1' < '2.11.0rc1' < '2.11.0' < '2.11.0.post1'.

    The first version in the text counts ('580.65.06'; 'cu130' -> 130; 'python3.11' -> 3.11); a local label
    ('+cu130') is ignored; anything without digits -> (). Standard library only (hostcheck runs on the node, where
    packaging may be absent); the tests hold it against packaging.version where that is importable.
    """
    m = _PEP440.search(str(version or ""))
    if not m:
        return ()
    release = [int(p) for p in m.group("release").split(".")]
    release += [0] * (_RELEASE_WIDTH - len(release))
    if m.group("pre_l"):
        pre = (_PRE[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    elif m.group("dev") and not m.group("post"):
        pre = (-1, 0)  # X.devN sorts before X.aN
    else:
        pre = (3, 0)  # a final release sorts after its pre-releases
    post = int(m.group("post_n1") or m.group("post_n2") or 0) if m.group("post") else -1
    dev = int(m.group("dev_n") or 0) if m.group("dev") else _ABSENT
    return (*release, *pre, post, dev)


def release_tuple(version: Any) -> tuple[int, ...]:
    """The release segment alone, as written: '580.65.06' -> (580, 65, 6); '2.11.0rc1' -> (2, 11, 0); none -> ()."""
    m = _PEP440.search(str(version or ""))
    return tuple(int(p) for p in m.group("release").split(".")) if m else ()


def torch_minor(torch_version: Any) -> str:
    """'2.13.0' / '2.13.0+cu130' / '2.13' -> '2.13'."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(torch_version or ""))
    if not m:
        raise ValueError(f"not a torch version: {torch_version!r}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def cuda_normalize(cuda: Any) -> str:
    """'12.8', '12.8.1', 'cu128', 'CU128' -> '12.8'; 'cpu' -> 'cpu'; '' stays ''."""
    text = str(cuda if cuda is not None else "").strip().lower()
    if text in ("cpu", "none"):
        return CPU
    if text == "":
        return ""
    m = re.match(r"^cu(\d{2,3})$", text)
    if m:
        digits = m.group(1)
        return f"{int(digits[:-1])}.{int(digits[-1])}"
    m = re.match(r"^(\d+)\.(\d+)", text)
    if m:
        return f"{int(m.group(1))}.{int(m.group(2))}"
    raise ValueError(f"not a CUDA version: {cuda!r}")


def cuda_tag(cuda: Any) -> str:
    """'12.8' -> 'cu128'; 'cpu' -> 'cpu'."""
    norm = cuda_normalize(cuda)
    if norm in (CPU, ""):
        return norm
    major, minor = norm.split(".")
    return f"cu{major}{minor}"


def python_version(name: Any) -> str:
    """'python3.11' / '/usr/bin/python3.12' / '3.11' -> '3.11'; '' when the name carries no version."""
    m = re.search(r"(\d+)\.(\d+)\s*$", str(name or ""))
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else ""


def pci_id(value: Any) -> str:
    """'0x2330' / '2330' / '10de:2330' -> '0x2330' (lower case); '' for anything else."""
    m = re.search(r"(?:^|:|0x)([0-9a-fA-F]{4})\s*$", str(value or "").strip())
    return f"0x{m.group(1).lower()}" if m else ""


# --- the data ------------------------------------------------------------------------------------


def _merge(base: Any, extra: Any) -> Any:
    """Deep merge of dicts; anything else in `extra` replaces what `base` had."""
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for key, value in extra.items():
            out[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(extra)


def load(overrides: Any = None, path: Path | None = None) -> dict[str, Any]:
    """The platform data, with `overrides` (same shape, any subset) merged in; ValueError for data that
    :func:`validate` refuses (the file's or the merged result)."""
    global _cache
    if path is not None:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        validate(data)
    else:
        if _cache is None:
            fresh = json.loads(DATA_PATH.read_text(encoding="utf-8"))
            validate(fresh)
            _cache = fresh
        data = _cache
    if overrides:
        if not isinstance(overrides, dict):
            raise ValueError("gpunode_platform_overrides must be a mapping shaped like platform.json")
        merged = _merge(data, overrides)
        validate(merged)
        return merged
    return copy.deepcopy(data)


def _range(value: Any, what: str) -> None:
    """A [lowest, highest] pair of versions, lowest <= highest: an empty or open range is an error, never 'any'."""
    if not (isinstance(value, list) and len(value) == 2 and all(vtuple(v) for v in value)):
        raise ValueError(
            f"{what} must be [lowest, highest] (two versions), not {value!r}: an empty range is no range"
        )
    if vtuple(value[0]) > vtuple(value[1]):
        raise ValueError(f"{what} is empty: {value[0]} is above {value[1]}")


def validate(data: dict) -> None:
    """Refuse data that would read as "anything goes": a torch release without its Python range, a build without
    its GPU architectures (only an 'extra' build, installed only when named, may leave them unpublished)."""
    for minor, row in (data.get("torch") or {}).items():
        if not isinstance(row, dict):
            raise ValueError(f"torch {minor}: a row must be a mapping")
        _range(row.get("python"), f"torch {minor}: python")
        for tag, variant in (row.get("variants") or {}).items():
            if not (variant or {}).get("sm") and (variant or {}).get("role") != "extra":
                raise ValueError(
                    f"torch {minor} {tag}: sm (its GPU architectures) is empty; an empty list is no list"
                )


def min_driver(data: dict, cuda: Any, policy: str = "compat") -> str:
    """The oldest Linux driver a CUDA version runs on ('' for cpu or a version not in the data)."""
    norm = cuda_normalize(cuda)
    if norm in (CPU, ""):
        return ""
    major = norm.partition(".")[0]
    if policy == "toolkit":
        return str(data["cuda"].get(norm, {}).get("min_driver", ""))
    return str(data["cuda_major"].get(major, {}).get("min_driver_compat", ""))


def _at_least(need: str) -> str:
    """'>= 610.43.02', or for a bare branch (CUDA 13.4's release notes name R615, no version) 'of branch 615 or later'."""
    return f"of branch {need} or later" if re.fullmatch(r"\d+", need) else f">= {need}"


def driver_satisfies(driver: Any, required: Any) -> bool:
    """A driver version, or a bare branch ('580' = the newest of the branch), against a minimum."""
    if re.fullmatch(r"\s*\d+\s*", str(driver or "")):
        return int(str(driver)) >= (release_tuple(required) or (0,))[0]
    return vtuple(driver) >= vtuple(required)


_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def _today(today: Any = None) -> datetime.date:
    if isinstance(today, datetime.date):
        return today
    if today:
        return datetime.date.fromisoformat(str(today))
    return datetime.date.today()


def branch_lifecycle(data: dict, branch: Any, today: Any = None) -> dict:
    """NVIDIA's lifecycle of a driver branch ('535', or a version '535.261.03'), from the data's driver_branches:
    {branch, known, type, end_of_life ('June 2026', 'ended', ''), ended, source}. A branch is supported through the
    month its end of life names; a branch the table lacks is known: False (never guessed)."""
    major = release_tuple(branch)[:1]
    key = str(major[0]) if major else ""
    row = data.get("driver_branches", {}).get(key)
    out = {"branch": key, "known": bool(row), "type": "", "end_of_life": "", "ended": False, "source": ""}
    if not row:
        return out
    eol = str(row.get("end_of_life") or "")
    ended = eol == "ended"
    m = re.fullmatch(r"(\d{4})-(\d{2})", eol)
    if m:
        year, month = int(m.group(1)), int(m.group(2))
        first_after = datetime.date(year + month // 12, month % 12 + 1, 1)
        ended = _today(today) >= first_after
        eol = f"{_MONTHS[month - 1]} {year}"
    out.update(
        type=str(row.get("type") or ""), end_of_life=eol, ended=ended, source=str(row.get("source", ""))
    )
    return out


def branch_to_move_to(
    data: dict, archs: list[dict] | None = None, today: Any = None, at_least: Any = ""
) -> str:
    """The supported branch to move to: the default branch if NVIDIA still supports it, every GPU's architecture
    takes it and it runs a driver >= `at_least`, else the long-term-support or production branch with the latest
    end of life that does ('' when none)."""
    archs = archs or []

    def fits(b: str) -> bool:
        return all(
            (not a.get("min_branch") or vtuple(b) >= vtuple(a["min_branch"]))
            and (not a.get("max_branch") or vtuple(b) <= vtuple(a["max_branch"]))
            for a in archs
        )

    live = [
        b
        for b, row in data.get("driver_branches", {}).items()
        if row.get("type") in ("long-term support", "production")
        and re.fullmatch(r"\d{4}-\d{2}", str(row.get("end_of_life") or ""))
        and not branch_lifecycle(data, b, today)["ended"]
        and fits(b)
        and (not at_least or driver_satisfies(b, at_least))
    ]
    default = str(data["defaults"]["driver_branch"])
    if default in live:
        return default
    return max(live, key=lambda b: (str(data["driver_branches"][b]["end_of_life"]), vtuple(b)), default="")


def lifecycle_advice(
    data: dict, branch: Any, archs: list[dict], today: Any = None, via: str = ""
) -> tuple[str, str]:
    """(problem, fix) for installing or running a branch NVIDIA no longer supports, one not meant for production, or
    one the data lacks; ('', '') when supported. fix is the assignment that moves to the supported branch ('' if
    none), `via` its prefix ('gpunode_driver_source: nvidia and ' where the OS's own archive is the default)."""
    life = branch_lifecycle(data, branch, today)
    if not life["known"]:
        return (
            f"driver branch {life['branch'] or branch} is not in the platform data's lifecycle table "
            "(driver_branches): whether NVIDIA still supports it is not checked",
            "",
        )
    to = branch_to_move_to(data, archs, today)
    to_life = branch_lifecycle(data, to, today) if to else {}
    fix = f"{via}gpunode_driver_branch: {to}" if to and to != life["branch"] else ""
    what = f"branch {to} (NVIDIA {to_life.get('type')} branch, supported to {to_life.get('end_of_life')})"
    if life["ended"]:
        when = f"in {life['end_of_life']}" if life["end_of_life"] != "ended" else "(NVIDIA lists it as ended)"
        head = f"driver branch {life['branch']} reached its end of life {when}"
        if not to:
            return f"{head}, and no supported branch serves these GPUs", ""
        return f"{head}: no more bug or security fixes; move to {what}", fix
    if life["type"] == "new feature":
        return (
            f"driver branch {life['branch']} is a new feature branch (for early adopters, short-lived, not for "
            "production)" + (f": use {what}" if to else ""),
            fix,
        )
    return "", ""


def gpu(data: dict, device_id: Any) -> dict:
    """{'id', 'name', 'sm', 'arch'} of an NVIDIA PCI device id; sm '' and arch 'unknown' when not in the data."""
    key = pci_id(device_id)
    row = data["gpus"].get(key)
    if not row:
        return {
            "id": key,
            "name": "unknown NVIDIA device " + (key or str(device_id)),
            "sm": "",
            "arch": "unknown",
        }
    return {"id": key, "name": row["name"], "sm": row["sm"], "arch": row["arch"]}


def os_key(distribution: Any, major: Any) -> str:
    return f"{distribution} {major}"


# --- the decision --------------------------------------------------------------------------------


def _variant_fits(data: dict, row: dict, tag: str, gpus: list[dict], driver: str, policy: str) -> list[str]:
    """Why a torch CUDA variant cannot serve this node ([] when it can)."""
    why = []
    cuda = cuda_normalize(tag)
    need = min_driver(data, cuda, policy)
    if driver and need and not driver_satisfies(driver, need):
        why.append(f"{tag} needs driver {_at_least(need)}")
    archs = row["variants"][tag].get("sm", [])
    for g in gpus:
        if g["sm"] and archs and g["sm"] not in archs:
            why.append(f"{tag} has no sm_{g['sm'].replace('.', '')} kernels for the {g['name']}")
    return why


def _release(data: dict, minor: str) -> str:
    """The release to pin for a row: its 'latest' with a patch number ('2.14' -> '2.14.0')."""
    latest = str(data["torch"][minor].get("latest") or minor)
    return latest if len(release_tuple(latest)) >= 3 else f"{latest}.0"


def _nearest_torch(
    data: dict, gpus: list[dict], driver: str, policy: str, python: str, tag: str = ""
) -> tuple[str, str]:
    """(release, build) of the newest torch release with a build (`tag`, if given) that serves these GPUs, driver
    and Python; () if none."""
    for minor in sorted(data["torch"], key=vtuple, reverse=True):
        row = data["torch"][minor]
        if python and not _python_fits(row, python):
            continue
        for t in _ordered_variants(row):
            if (not tag or t == tag) and not _variant_fits(data, row, t, gpus, driver, policy):
                return _release(data, minor), t
    return ()


def _branch_for_release(data: dict, row: dict, gpus: list[dict], policy: str, today: Any) -> tuple[str, str]:
    """(branch, build): the supported driver branch that lets this release's best build run on these GPUs."""
    archs = [data["archs"].get(g["arch"], {}) for g in gpus]
    for tag in _ordered_variants(row):
        if _variant_fits(data, row, tag, gpus, "", policy):
            continue  # no driver fixes missing kernels
        to = branch_to_move_to(data, archs, today, min_driver(data, cuda_normalize(tag), policy))
        if to:
            return to, tag
    return ()


def _ordered_variants(row: dict) -> list[str]:
    """The builds "auto" may choose, best first: the release's default (its PyPI build), then stable, then legacy."""
    by_role = {r: [t for t, v in row["variants"].items() if v.get("role") == r] for r in AUTO_ROLES}
    ordered = [t for r in AUTO_ROLES for t in sorted(by_role[r], key=vtuple, reverse=True)]
    default = row.get("default")
    return ([default] if default in ordered else []) + [t for t in ordered if t != default]


def _python_range(row: dict) -> tuple[str, str]:
    """(lowest, highest) Python of a release (the loader guarantees both)."""
    lo, hi = row["python"]
    return str(lo), str(hi)


def _python_fits(row: dict, python: str) -> bool:
    lo, hi = _python_range(row)
    return vtuple(lo) <= vtuple(python) <= vtuple(hi)


class Planning:
    """What the stages of :func:`node_plan` share: the inputs, the data, the plan being built and, as each stage
    settles it, its decision (the OS row, the GPUs, the driver, the training Python, torch's row and build).
    A stage reads the fields earlier stages set and returns False to stop the pipeline (the plan then says why).
    A plain class, not a dataclass: the roles' filter loads this file by path, outside sys.modules, where
    dataclasses cannot resolve string annotations."""

    def __init__(
        self,
        data: dict,
        os: dict | None = None,
        gpus: Any = None,
        driver: dict | None = None,
        torch: dict | None = None,
        cuda: dict | None = None,
        enforce_os: bool = True,
        today: Any = None,
    ) -> None:
        self.data, self.gpus, self.enforce_os, self.today = data, gpus, enforce_os, today
        self.os, self.driver = dict(os or {}), dict(driver or {})
        self.torch, self.cuda = dict(torch or {}), dict(cuda or {})
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.plan: dict[str, Any] = {"ok": False, "errors": self.errors, "warnings": self.warnings}
        # Set by the stages, in order.
        self.key = ""
        self.os_row: dict = {}
        self.found: list[dict] = []
        self.drv_on = True
        self.source = self.branch = self.version = self.judged = ""
        self.pyname = self.pyver = ""
        self.policy = "compat"
        self.tver = self.minor = self.tag = ""
        self.row: dict = {}


def stage_os(p: Planning) -> bool:
    """The OS row: supported or refused with why, the training Python, the distro's driver."""
    data, os = p.data, p.os
    p.key = key = os_key(os.get("distribution", ""), os.get("major", ""))
    os_row = data["os"].get(key)
    p.plan["os"] = {"key": key, "supported": bool(os_row and os_row.get("supported"))}
    if not (os_row and os_row.get("supported")):
        supported = ", ".join(supported_os(data))
        why = f"{key} is not supported: {os_row.get('why', '')}" if os_row else f"{key} is not a supported OS"
        borrowed = data["os_family_fallback"].get(str(os.get("family", "")))
        if p.enforce_os or not borrowed:
            p.errors.append(
                f"{why}; nearest working choice: a supported OS ({supported})"
                + (
                    f", or gpunode_base_enforce_supported_os: false to try it with the {borrowed} row"
                    if borrowed
                    else " (gpunode_base_enforce_supported_os: false cannot help: no row of its OS family to borrow)"
                )
            )
            return False
        p.warnings.append(
            f"{why}; trying anyway with the {borrowed} row (gpunode_base_enforce_supported_os: false)"
        )
        os_row = data["os"][borrowed]
    p.os_row = os_row
    return True


def stage_gpus(p: Planning) -> bool:
    """The GPUs on the PCI bus, each with its architecture where the data knows its id."""
    p.found = found = [gpu(p.data, d) for d in (p.gpus or [])]
    p.plan["gpus"] = found
    unknown = sorted({g["id"] for g in found if not g["sm"]})
    if unknown:
        p.warnings.append(
            f"GPU PCI id(s) {', '.join(unknown)} not in the platform data: their architecture is not checked "
            "(add them under gpus in gpunode_platform_overrides)"
        )
    return True


def stage_driver(p: Planning) -> bool:
    """Driver: source, branch, version; the branch each GPU needs; the branch's lifecycle."""
    data, driver, os_row, key, errors = p.data, p.driver, p.os_row, p.key, p.errors
    p.drv_on = drv_on = bool(driver.get("enabled", True))
    source = str(driver.get("source") or "auto")
    if source == "auto":
        source = os_row.get("driver_source_default", "nvidia")
    if drv_on and source == "distro" and not os_row.get("distro_driver_branch"):
        errors.append(
            f"{key} has no distro NVIDIA driver: set gpunode_driver_source: nvidia "
            f"(NVIDIA's repository, gpunode_driver_branch: {data['defaults']['driver_branch']})"
        )
    branch = str(driver.get("branch") or "")
    if not branch:
        branch = str(
            os_row.get("distro_driver_branch") if source == "distro" else data["defaults"]["driver_branch"]
        )
    version = str(driver.get("version") or "")
    only = [str(b) for b in os_row.get("distro_driver_branches") or []]
    if drv_on and source == "distro" and only and branch not in only:
        errors.append(
            f"{key}'s archive ships only the {', '.join(only)} driver branch, not {branch}: "
            "set gpunode_driver_source: nvidia for NVIDIA's repository"
        )
    for g in p.found:
        arch = data["archs"].get(g["arch"], {})
        lo, hi = arch.get("min_branch", ""), arch.get("max_branch", "")
        if drv_on and lo and vtuple(branch) < vtuple(lo):
            errors.append(
                f"the {g['name']} ({arch.get('name')}) needs driver branch >= {lo}, not {branch}: "
                + (
                    f"set gpunode_driver_source: nvidia and gpunode_driver_branch: {data['defaults']['driver_branch']}"
                    if source == "distro"
                    else f"set gpunode_driver_branch: {data['defaults']['driver_branch']}"
                )
            )
        if drv_on and hi and vtuple(branch) > vtuple(hi):
            errors.append(
                f"the {g['name']} ({arch.get('name')}) is supported up to driver branch {hi}, not {branch}: "
                f"set gpunode_driver_branch: {hi}"
            )
    errors[:] = list(dict.fromkeys(errors))
    if drv_on:
        archs = [data["archs"].get(g["arch"], {}) for g in p.found]
        via = "gpunode_driver_source: nvidia and " if source == "distro" else ""
        problem, fix = lifecycle_advice(data, version or branch, archs, p.today, via)
        if problem:
            p.warnings.append(problem + (f": set {fix}" if fix else ""))
    p.source, p.branch, p.version = source, branch, version
    # What torch's CUDA build is judged against: the running driver, else what the role will install.
    p.judged = (version or branch) if drv_on else str(driver.get("installed") or "")
    return True


def stage_flavour(p: Planning) -> bool:
    """Kernel-module flavour: open or proprietary, from the GPUs, the branch and the source."""
    data, driver, errors, found = p.data, p.driver, p.errors, p.found
    drv_on, branch, source = p.drv_on, p.branch, p.source
    wanted_open = str(driver.get("open", "auto")).strip().lower()
    needs_open = [g for g in found if data["archs"].get(g["arch"], {}).get("open") == "required"]
    no_open = [g for g in found if data["archs"].get(g["arch"], {}).get("open") == "unsupported"]
    if wanted_open == "auto":
        if needs_open:
            flavour, why = "open", f"{needs_open[0]['name']} needs NVIDIA's open kernel modules"
        elif no_open:
            flavour, why = "proprietary", f"{no_open[0]['name']} is not supported by the open kernel modules"
        elif vtuple(branch) >= vtuple(data["defaults"]["open_default_from_branch"]):
            flavour, why = (
                "open",
                f"NVIDIA's default from branch {data['defaults']['open_default_from_branch']}",
            )
        else:
            flavour, why = "proprietary", f"branch {branch} predates NVIDIA's open-module default"
    elif wanted_open in ("true", "yes", "1", "on"):
        flavour, why = "open", "gpunode_driver_open_kernel_modules is true"
    elif wanted_open in ("false", "no", "0", "off"):
        flavour, why = "proprietary", "gpunode_driver_open_kernel_modules is false"
    else:
        errors.append(
            f"gpunode_driver_open_kernel_modules must be auto, true or false, not {driver.get('open')!r}"
        )
        flavour, why = "proprietary", ""
    if needs_open and no_open:
        errors.append(
            f"{needs_open[0]['name']} needs the open kernel modules and {no_open[0]['name']} cannot use them: "
            "one driver cannot serve both, and no variable changes that; split these GPUs across nodes"
        )
    elif drv_on and flavour == "proprietary" and needs_open:
        errors.append(
            f"the {needs_open[0]['name']} works only with NVIDIA's open kernel modules: "
            "set gpunode_driver_open_kernel_modules: auto (or true)"
        )
    elif drv_on and flavour == "open" and no_open:
        errors.append(
            f"the {no_open[0]['name']} is not supported by NVIDIA's open kernel modules: "
            "set gpunode_driver_open_kernel_modules: auto (or false)"
        )
    if drv_on and flavour == "open" and source == "distro" and not p.os_row.get("distro_open_modules"):
        errors.append(
            f"{p.key}'s archive has no open kernel modules at the driver's version "
            f"({p.os_row.get('distro_open_modules_why', '')}): set gpunode_driver_source: nvidia, "
            "or gpunode_driver_open_kernel_modules: false where the GPUs allow it"
        )
    p.plan["driver"] = {
        "enabled": drv_on,
        "source": source,
        "branch": branch,
        "version": p.version,
        "open": flavour == "open",
        "flavour": flavour,
        "flavour_reason": why,
        "judged": p.judged,
    }
    return True


def stage_python(p: Planning) -> bool:
    """The training Python: its name and version, and the OS packages that bring it."""
    os_python = p.os_row["python"]
    p.pyname = pyname = str(p.torch.get("python") or os_python["name"])
    pyver = str(p.torch.get("python_version") or python_version(pyname))
    if not pyver and pyname == os_python["name"]:
        pyver = os_python["version"]
    p.pyver = pyver
    p.plan["python"] = {
        "name": pyname,
        "version": pyver,
        "packages": list(os_python["packages"]) if pyname == os_python["name"] else [],
    }
    return True


def stage_torch_release(p: Planning) -> bool:
    """torch's release row (known, released) and whether it runs on the training Python."""
    data, torch, errors = p.data, p.torch, p.errors
    p.tver = tver = str(torch.get("version") or data["defaults"]["torch"])
    p.policy = policy = str(torch.get("policy") or "compat")
    if policy not in POLICIES:
        errors.append(f"gpunode_pytorch_driver_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        return False
    released = [m for m in sorted(data["torch"], key=vtuple) if data["torch"][m].get("status") != "planned"]
    newest = released[-1] if released else ""
    try:
        p.minor = minor = torch_minor(tver)
    except ValueError as exc:
        errors.append(f"gpunode_pytorch_version: {exc}: set it to a release such as {newest}.0")
        return False
    row = data["torch"].get(minor)
    if row is None:
        errors.append(
            f"torch {tver} is not in the platform data (known: {', '.join(sorted(data['torch'], key=vtuple))}): "
            f"set gpunode_pytorch_version: {newest}.0 (the newest released one the data has), or add its row under "
            "torch in gpunode_platform_overrides, with its source"
        )
        return False
    p.row = row
    if row.get("status") == "planned":
        p.warnings.append(
            f"torch {minor} is planned, not confirmed released, in the platform data ({row['source'].get('status', '')})"
        )
    pyver, key = p.pyver, p.key
    if bool(torch.get("enabled", True)) and pyver and not _python_fits(row, pyver):
        lo, hi = _python_range(row)
        os_python = p.os_row["python"]["name"]
        good = (
            os_python if _python_fits(row, python_version(os_python) or p.os_row["python"]["version"]) else ""
        )
        other = [
            m
            for m in sorted(data["torch"], key=vtuple, reverse=True)
            if _python_fits(data["torch"][m], pyver)
        ]
        errors.append(
            f"torch {tver} supports Python {lo} to {hi}, and the training Python {p.pyname} is {pyver}: "
            f"set gpunode_pytorch_python: {good or 'python' + hi} (an interpreter in that range"
            + (f", {key}'s own" if good else f"; {key}'s {os_python} is not")
            + ")"
            + (f", or gpunode_pytorch_version: {other[0]} (supports Python {pyver})" if other else "")
        )
    return True


def stage_torch_build(p: Planning) -> bool:
    """torch's CUDA build: the best one that serves these GPUs and driver ("auto"), or the one named, checked."""
    wish = str(p.torch.get("cuda") or "auto").strip().lower()
    if wish == "auto":
        return _auto_build(p)
    return _named_build(p, wish)


def _auto_build(p: Planning) -> bool:
    data, row, found, judged, policy, tver = p.data, p.row, p.found, p.judged, p.policy, p.tver
    if not found:
        p.errors.append(
            "no NVIDIA GPU on the PCI bus, so no CUDA build can be chosen: set gpunode_pytorch_cuda: cpu "
            "for a CPU node, or name the build (e.g. cu130)"
        )
        return False
    fits = {t: _variant_fits(data, row, t, found, judged, policy) for t in _ordered_variants(row)}
    usable = [t for t, why_not in fits.items() if not why_not]
    if usable:
        p.tag = usable[0]
        return True
    near = _nearest_torch(data, found, judged, policy, p.pyver)
    to = _branch_for_release(data, row, found, policy, p.today) if p.drv_on else ""
    choices = (
        [
            f"torch {near[0]} ({near[1]}): set gpunode_pytorch_version: {near[0]} and gpunode_pytorch_cuda: {near[1]}"
        ]
        if near
        else []
    ) + ([f"gpunode_driver_branch: {to[0]} (for torch {tver}'s {to[1]})"] if to else [])
    p.errors.append(
        f"no CUDA build of torch {tver} serves this node ("
        + "; ".join(w for ws in fits.values() for w in ws)
        + ")"
        + (
            ": nearest working choice " + ", or ".join(choices)
            if choices
            else ": no release or supported driver branch in the data serves these GPUs"
            + ("" if p.drv_on else " (the driver role is off: gpunode_driver_enabled)")
        )
    )
    return False


def _named_build(p: Planning, wish: str) -> bool:
    data, row, found, judged, policy, tver, errors = (
        p.data,
        p.row,
        p.found,
        p.judged,
        p.policy,
        p.tver,
        p.errors,
    )
    known = ", ".join(sorted(row["variants"], key=vtuple))
    try:
        p.tag = tag = cuda_tag(wish)
    except ValueError as exc:
        errors.append(f"gpunode_pytorch_cuda: {exc}: set auto, cpu or one of torch {tver}'s builds ({known})")
        return False
    if tag == CPU:
        return True
    if tag not in row["variants"]:
        with_tag = [m for m in sorted(data["torch"], key=vtuple) if tag in data["torch"][m]["variants"]]
        errors.append(
            f"torch {tver} has no {tag} build; its CUDA builds are {known} (or cpu): set gpunode_pytorch_cuda "
            f"to one of them (or auto)"
            + (f", or gpunode_pytorch_version: {with_tag[-1]} (the newest with {tag})" if with_tag else "")
        )
        return False
    near = [t for t in _ordered_variants(row) if not _variant_fits(data, row, t, found, judged, policy)]
    for why_not in _variant_fits(data, row, tag, found, judged, policy):
        to = ""
        if "driver" in why_not and p.drv_on:
            archs = [data["archs"].get(g["arch"], {}) for g in found]
            to = branch_to_move_to(data, archs, p.today, min_driver(data, cuda_normalize(tag), policy))
        other = (
            ()
            if near
            else (
                _nearest_torch(data, found, judged, policy, p.pyver, tag)
                or _nearest_torch(data, found, judged, policy, p.pyver)
            )
        )
        choices = (
            ([f"gpunode_pytorch_cuda: {near[0]}"] if near else [])
            + ([f"gpunode_driver_branch: {to}"] if to else [])
            + ([f"gpunode_pytorch_version: {other[0]} (gpunode_pytorch_cuda: {other[1]})"] if other else [])
        )
        errors.append(
            f"torch {tver} {why_not}"
            + (": nearest working choice " + ", or ".join(choices) if choices else "")
            + ("" if choices else ": no build, release or supported branch in the data serves this node")
        )
    return True


def stage_torch_plan(p: Planning) -> bool:
    """The plan's torch entry: the release, the build and what comes with it."""
    row, tag = p.row, p.tag
    cuda_ver = cuda_normalize(tag)
    companions = row.get("companions", {})
    p.plan["torch"] = {
        "enabled": bool(p.torch.get("enabled", True)),
        "version": p.tver,
        "minor": p.minor,
        "tag": tag,
        "cuda": cuda_ver,
        "role": row["variants"].get(tag, {}).get("role", "cpu" if tag == CPU else ""),
        "python": list(row.get("python", [])),
        "min_driver": min_driver(p.data, cuda_ver, p.policy),
        "torchvision": companions.get("torchvision", ""),
        "torchaudio": companions.get("torchaudio", ""),
        "source": row.get("source", ""),
    }
    return True


def stage_cuda(p: Planning) -> bool:
    """CUDA toolkit, cuDNN and NCCL follow torch's CUDA major."""
    data, cuda, errors, row, tag, tver, key = p.data, p.cuda, p.errors, p.row, p.tag, p.tver, p.key
    policy, judged = p.policy, p.judged
    cuda_ver = cuda_normalize(tag)
    cuda_on = bool(cuda.get("enabled", True))
    try:
        want = cuda_normalize(cuda.get("version") or "")
    except ValueError as exc:
        errors.append(f"gpunode_cuda_version: {exc} (major.minor such as 13.0, or empty to follow torch)")
        return False
    if want in ("", CPU):
        want = cuda_ver if cuda_ver != CPU else ""
    major = want.partition(".")[0] if want else ""
    if cuda_on and want and cuda_ver not in (CPU, "") and major != cuda_ver.partition(".")[0]:
        errors.append(
            f"gpunode_cuda_version {want} is CUDA {major}, but torch {tver} is the {tag} build (CUDA "
            f"{cuda_ver.partition('.')[0]}): cuDNN and NCCL must match torch's CUDA major; leave gpunode_cuda_version "
            f"empty to follow torch (CUDA {cuda_ver}), or set gpunode_pytorch_cuda to a CUDA {major} build"
            + (
                " ("
                + ", ".join(t for t in sorted(row["variants"], key=vtuple) if t.startswith(f"cu{major}"))
                + ")"
                if any(t.startswith(f"cu{major}") for t in row["variants"])
                else f" (torch {tver} has none)"
            )
        )
    if cuda_on and not want:
        errors.append(
            "gpunode_cuda_version is empty and torch is a CPU build, so there is no CUDA version to follow: "
            "set gpunode_cuda_enabled: false, or a version such as gpunode_cuda_version: "
            + max(data["cuda"], key=vtuple)
        )
    if cuda_on and str(cuda.get("source") or "") == "distro" and cuda.get("toolkit", True):
        distro = str(p.os_row.get("distro_cuda_toolkit") or "")
        if not distro:
            errors.append(
                f"the platform data names no distro CUDA toolkit for {key}: set gpunode_cuda_source: nvidia or pip"
            )
        elif cuda_ver not in (CPU, "") and distro.partition(".")[0] != cuda_ver.partition(".")[0]:
            errors.append(
                f"{key}'s archive ships CUDA toolkit {distro}, but torch {tver} is the {tag} build: "
                "set gpunode_cuda_source: pip (torch brings its own CUDA libraries) or nvidia "
                f"(NVIDIA's cuda-toolkit-{cuda_ver.replace('.', '-')})"
            )
        else:
            want, major = distro, distro.partition(".")[0]
    maj_row = data["cuda_major"].get(major, {})
    # cuDNN/NCCL pins: a build's own row where the builds of one CUDA major pin differently (2.11), else the major's.
    libraries = row.get("libraries", {})
    libs = libraries.get(tag) if tag.startswith(f"cu{major}") and tag in libraries else None
    libs = libs or libraries.get(f"cu{major}", {})
    known = sorted((v for v in data["cuda"] if v.partition(".")[0] == major), key=vtuple)
    if cuda_on and want and want not in data["cuda"]:
        below = [v for v in known if vtuple(v) <= vtuple(want)]
        near = (below or known or [""])[-1]
        errors.append(
            f"CUDA {want} is not in the platform data's toolkit table, so the driver it needs is unknown (CUDA "
            f"{major}'s minimum is not its own): "
            + (f"set gpunode_cuda_version: {near} (or empty to follow torch's build), " if near else "")
            + "or add its row under cuda in gpunode_platform_overrides with the driver its release notes name"
        )
    elif (
        cuda_on
        and want
        and p.drv_on
        and maj_row
        and not driver_satisfies(judged, min_driver(data, want, policy))
    ):
        need = min_driver(data, want, policy)
        to = branch_to_move_to(data, [data["archs"].get(g["arch"], {}) for g in p.found], p.today, need)
        runs = [v for v in known if driver_satisfies(judged, min_driver(data, v, policy))]
        errors.append(
            f"CUDA {want} needs driver {_at_least(need)}; the driver is {judged}: "
            + " or ".join(
                ([f"set gpunode_driver_branch: {to}"] if to else [])
                + ([f"gpunode_cuda_version: {runs[-1]}"] if runs else [])
            )
            + (
                ""
                if to or runs
                else "no supported driver branch (gpunode_driver_branch) or CUDA version in the data fits"
            )
        )
    p.plan["cuda"] = {
        "enabled": cuda_on,
        "version": want,
        "major": major,
        "wheel_suffix": f"cu{major}" if major else "",
        "cudnn": str(libs.get("cudnn", "")),
        "nccl": str(libs.get("nccl", "")),
        "min_driver": min_driver(data, want, policy) if want else "",
    }
    return True


def stage_finish(p: Planning) -> bool:
    """The architectures, the OS's family and Python, and the verdict: ok when no stage said otherwise."""
    p.plan["sm"] = sorted({g["sm"] for g in p.found if g["sm"]}, key=vtuple)
    p.plan["os"].update({"family": p.os_row["family"], "python": p.os_row["python"]["name"]})
    p.errors[:] = list(dict.fromkeys(p.errors))
    p.plan["ok"] = not p.errors
    return True


#: node_plan's pipeline, in order: each stage reads what the ones before it settled.
STAGES = (
    stage_os,
    stage_gpus,
    stage_driver,
    stage_flavour,
    stage_python,
    stage_torch_release,
    stage_torch_build,
    stage_torch_plan,
    stage_cuda,
    stage_finish,
)


def node_plan(
    os: dict | None = None,
    gpus: Any = None,
    driver: dict | None = None,
    torch: dict | None = None,
    cuda: dict | None = None,
    overrides: Any = None,
    enforce_os: bool = True,
    today: Any = None,
) -> dict:
    """Decide torch's variant, then the driver branch and flavour, CUDA, cuDNN and NCCL, for one node.

    os:     {distribution, major, family}                  (Ansible's distribution facts)
    gpus:   PCI device ids of the node's NVIDIA GPUs       (['0x2330', ...])
    driver: {enabled, source, branch, version, open, installed}
            source auto|distro|nvidia; branch/version '' = default; open auto|true|false; installed: the
            running or installed driver version ('' on a fresh node)
    torch:  {enabled, version, cuda, policy, python, python_version}
            cuda auto|cpu|cu130|13.0; python: the interpreter name ('' = the OS's training Python);
            python_version: its X.Y when probed ('' = from the name or the OS row)
    cuda:   {enabled, version, source, toolkit}            version '' = follow torch's variant; source
            pip|distro|nvidia (distro: the OS's own toolkit version, which must share torch's major)
    enforce_os: False lets an OS outside the data borrow its family's row (with a warning).
    today:  the date branch lifecycles are judged on (a date or 'YYYY-MM-DD'; default: today).

    The stages (STAGES) run in order; one that finds no way on stops the pipeline, and the plan says why.
    """
    try:
        data = load(overrides)
    except (ValueError, TypeError, KeyError) as exc:
        return {"ok": False, "errors": [f"gpunode_platform_overrides: {exc}"], "warnings": []}
    p = Planning(data, os, gpus, driver, torch, cuda, enforce_os, today)
    for stage in STAGES:
        if not stage(p):
            break
    return p.plan


def supported_os(data: dict) -> list[str]:
    return [k for k, v in data["os"].items() if v.get("supported")]


def os_row_for(data: dict, os_id: Any, version_id: Any) -> tuple[str, dict | None]:
    """os-release ID and VERSION_ID ('debian', '12' / 'ubuntu', '24.04') -> ('Debian 12', its row or None)."""
    dist = data["os_release_ids"].get(str(os_id or "").lower(), "")
    major = str(version_id or "").partition(".")[0]
    key = os_key(dist, major)
    return key, data["os"].get(key) if dist else None


def default_branch(data: dict, os_row: dict | None) -> tuple[str, str]:
    """(branch, source) the roles install by default on this OS."""
    if os_row and os_row.get("driver_source_default") == "distro" and os_row.get("distro_driver_branch"):
        return str(os_row["distro_driver_branch"]), "distro"
    return str(data["defaults"]["driver_branch"]), "nvidia"


def index_for(data: dict, driver: Any = "", sm: list[str] | None = None, policy: str = "compat") -> str:
    """The torch index (cu130, cu126, ...) of the default torch release that a driver and these GPUs can run.

    driver: a driver version ('580.95.05') or a bare branch ('535'); '' when unknown (any driver).
    '' when no variant fits (the fix is then the driver, not the index).
    """
    row = data["torch"][torch_minor(data["defaults"]["torch"])]
    gpus = [{"sm": s_, "name": f"sm_{s_}"} for s_ in (sm or [])]
    for tag in _ordered_variants(row):
        if not _variant_fits(data, row, tag, gpus, str(driver or ""), policy):
            return tag
    return ""
