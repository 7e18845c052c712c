"""fabric.E009: NCCL's configuration against the node: every place NCCL takes its variables from
(hostcheck.gather.nccl_conf: the training environment, NCCL_CONF_FILE or ~/.nccl.conf, /etc/nccl.conf, in NCCL's
order), each setting judged where it is, named by its file and line. A stale value NCCL uses fails; one that
another source shadows warns (NCCL does not use it now, but will once that other source changes).

The forms are NCCL's environment variable documentation's: NCCL_IB_HCA and NCCL_SOCKET_IFNAME are comma-separated
prefixes, ``^`` excludes, ``=`` asks for exact names, ``name:port``; NCCL_NET_GDR_LEVEL is LOC, PIX, PXB, PHB or
SYS (the farthest PCIe distance at which NCCL uses GPUDirect RDMA; integers are a legacy form whose meaning changed
between versions).
"""

from __future__ import annotations

import os
from typing import Any

from hostcheck.checks.fabric_plan import Fabric, group, setup, up, verdict, within
from hostcheck.gather.nccl_conf import ENV_FILE, Setting, Source
from hostcheck.gather.rdma import nccl_list
from hostcheck.gather.rdma_topology import LEVELS, PXB
from hostcheck.registry import Outcome, Status, check, plural

IB_HCA, SOCKET_IFNAME, GDR_LEVEL, IB_DISABLE = (
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_IB_DISABLE",
)
JUDGED = (IB_HCA, SOCKET_IFNAME, GDR_LEVEL, IB_DISABLE)
FAIL, WARN = Status.FAIL, Status.WARN


def _matches(name: str, entries: list[tuple[str, int | None]], exact: bool) -> list[tuple[str, int | None]]:
    return [(n, port) for n, port in entries if (name == n if exact else name.startswith(n))]


def _quoted(value: str, src: Source) -> str:
    if src.kind != ENV_FILE and value[:1] in "\"'":
        return " (NCCL's files are no shell: the quotes are part of the value)"
    return ""


def _ib_hca(f: Fabric, value: str, src: Source) -> list[tuple[Status, str, str]]:
    """(severity, what, brief) for each stale entry of NCCL_IB_HCA."""
    ports = f.ports
    exclude, exact, entries = nccl_list(value)
    more = value.count(",") + 1 - len(entries)
    out = []
    if exclude:
        if not [p for p in ports if not _matches(p.device, entries, exact) and up(p)]:
            out.append((FAIL, "excludes every active RDMA port", "excludes every active port"))
        return out
    absent, down = [], []
    for name, port in entries:
        shown = f"{name}{f':{port}' if port else ''}"
        hits = [
            p for p in ports if _matches(p.device, [(name, port)], exact) and (port is None or p.port == port)
        ]
        if not hits:
            absent.append(shown)
        elif not any(up(p) for p in hits):
            down.append(f"{shown} ({', '.join(f'{p.name} {p.state or chr(63)}' for p in hits[:4])})")
    if absent:
        said = group([("", n) for n in absent])[0].rstrip(": ")
        verb = "does" if len(absent) == 1 else "do"
        out.append(
            (FAIL, f"names {said}, which {verb} not exist{_quoted(value, src)}", f"{absent[0][:20]} absent")
        )
    if down:
        out.append(
            (
                FAIL,
                f"names {group([('', n) for n in down])[0].rstrip(': ')}: not up",
                f"{down[0].split()[0][:20]} down",
            )
        )
    if more > 0:
        out.append(
            (WARN, f"{more} more entries not judged (the first {len(entries)} were)", f"{more} entries")
        )
    return out


def _ifname(f: Fabric, value: str, src: Source) -> list[tuple[Status, str, str]]:
    if not isinstance(f.r.netifs, dict):
        return []
    exclude, exact, entries = nccl_list(value)
    out = []
    for name, _port in [] if exclude else entries:
        hits = {n: st for n, st in f.r.netifs.items() if (n == name if exact else n.startswith(name))}
        if not hits:
            said = f"names {name}, which matches no network interface{_quoted(value, src)}"
            out.append((FAIL, said, f"{name[:20]} absent"))
        elif not any(st in ("up", "unknown") for st in hits.values()):
            said = ", ".join(f"{n} {st}" for n, st in list(hits.items())[:4])
            out.append((FAIL, f"names {name}: {said}", f"{name[:20]} down"))
    return out


def _gdr_level(f: Fabric, value: str, src: Source) -> list[tuple[Status, str, str]]:
    v = value.strip().upper()
    if v.isdigit():
        return []  # the legacy integer form: its meaning changed between NCCL versions, never judged here
    if v == "LOC":
        return [(WARN, "LOC: NCCL never uses GPUDirect RDMA", "LOC: GPUDirect off")]
    if v not in LEVELS:
        return [(WARN, f"is not one of LOC, {', '.join(LEVELS)}", f"{v[:12]} unknown")]
    # A NIC beyond PXB is fabric.E006's; the setting is stale where it turns GPUDirect off for a nearer one.
    far = [p for p in f.pairs if p.nic and not p.shared and not within(p.level, v) and within(p.level, PXB)]
    if not far:
        return []
    p = far[0]
    said = (
        f"{plural(len(far), 'GPU')} beyond {v}, e.g. {f.gpu(p.gpu)} and {p.nic} are {p.level} apart: NCCL will not use "
        f"GPUDirect RDMA for them"
    )
    return [(WARN, said, f"{v}, {len(far)} GPUs {p.level}")]


def _ib_disable(f: Fabric, value: str, src: Source) -> list[tuple[Status, str, str]]:
    if value.strip() == "1" and any(up(p) for p in f.ports):
        return [(WARN, "NCCL will not use the active RDMA ports (sockets only)", "IB off, ports active")]
    return []


JUDGE = {IB_HCA: _ib_hca, SOCKET_IFNAME: _ifname, GDR_LEVEL: _gdr_level, IB_DISABLE: _ib_disable}


def _short(value: str) -> str:
    return value if len(value) <= 60 else value[:57] + "..."


def _at(src: Source, s: Setting) -> str:
    return f"{os.path.basename(src.path)}:{s.line}" if src.path and s.line else "env"


@check(
    "fabric.E009",
    "NCCL's configuration names RDMA devices and interfaces that exist and are up",
    weight=3,
    needs=("rdma",),
)
def nccl_devices(s: Any) -> Outcome:
    f = setup(s)
    if isinstance(f, Outcome):
        return f
    cfg = f.r.nccl
    fails, warns, briefs, seen = [], [], [], []
    for src in cfg.sources:
        if src.error:
            warns.append(f"{src.shown} ({src.kind}) not read: {src.error}")
            briefs.append(f"{os.path.basename(src.shown)[:24]} not read")
        for st in src.settings:
            if st.name.strip() in JUDGED and st.name != st.name.strip():
                warns.append(
                    f"{_short(repr(st.name))} ({src.where(st)}): NCCL takes the name with its spaces, so it never "
                    "reads this "
                    "line; write NAME=value"
                )
                briefs.append(f"{st.name.strip()[5:]} name has spaces ({_at(src, st)})")
    for name in JUDGED:
        for setting, src, used in cfg.settings(name):
            where = src.where(setting)
            seen.append(f"{name}={_short(setting.value)} ({where}{'' if used else ', shadowed'})")
            for severity, what, brief in JUDGE[name](f, setting.value, src):
                line = f"{name}={_short(setting.value)} ({where}) {what}"
                if used and severity == FAIL:
                    fails.append(line)
                else:
                    warns.append(
                        line + ("" if used else " (shadowed: NCCL takes it from an earlier source now)")
                    )
                briefs.append(f"{name[5:]} {brief} ({_at(src, setting)})")
    read = [f"{src.shown}" for src in cfg.sources if src.present and not src.error]
    details = tuple(
        [f"{src.kind}: {src.shown}{' (absent)' if not src.present else ''}" for src in cfg.sources]
        + list(cfg.notes)
    )
    hint = (
        "fix the named file and line: name devices from 'ls /sys/class/infiniband' with an active port ('ibstat') "
        "and interfaces from 'ip link' (NCCL's environment variable documentation); NCCL takes the environment "
        "first, then NCCL_CONF_FILE (else ~/.nccl.conf), then /etc/nccl.conf"
    )
    where = f" (read: {', '.join(read)})" if read else " (no NCCL configuration found)"
    ok = "; ".join(seen) + f": every named device exists and is up{where}"
    if not seen:
        ok = f"no NCCL device variable set: NCCL chooses the devices itself{where}"
    return verdict(fails, warns, briefs, ok, hint, details=details)
