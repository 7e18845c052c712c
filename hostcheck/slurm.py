"""``--slurm-drain``: drain this node through scontrol when it is not ready, resume it once it is.

Like LBNL NHC, hostcheck marks its own drains with a reason prefix (``hostcheck: gpu.E005 ...``) and resumes
only a node whose reason carries it: a node an admin drained (or Slurm itself, or another health checker)
is never touched. Gathering (``scontrol show node``) is separate from deciding (:func:`decide`, pure), so
the tests drive every state through fixtures.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any

from hostcheck.config import REASON_MAX, SlurmSettings
from hostcheck.gather.base import CmdResult, Runner, run_cmd
from hostcheck.render.summary import headline
from hostcheck.report import Report

SCONTROL_TIMEOUT_S = 15.0
# `scontrol -o show node` prints "Reason=<text> [<user>@<time>]" and, after it, possibly more Key=value fields.
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\])?(?= [A-Z][A-Za-z]*=|$)")
_STATE = re.compile(r"\bState=(\S+)")


@dataclass(frozen=True)
class NodeState:
    name: str
    #: Slurm's state words, e.g. ("IDLE", "DRAIN") for IDLE+DRAIN.
    flags: tuple[str, ...]
    reason: str = ""

    @property
    def drained(self) -> bool:
        return any(f.startswith("DRAIN") for f in self.flags)

    @property
    def down(self) -> bool:
        return "DOWN" in self.flags


@dataclass(frozen=True)
class Action:
    """What --slurm-drain did: ``drain``, ``resume``, ``none`` (nothing to do), ``leave`` (someone else's drain),
    or ``error`` (scontrol failed)."""

    kind: str
    node: str
    message: str
    reason: str = ""


def node_name(settings: SlurmSettings, environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    return settings.node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def parse_node(text: str, name: str) -> NodeState | None:
    """The state and reason from ``scontrol -o show node NAME`` (one line), or None when it says nothing."""
    line = next((ln for ln in text.splitlines() if f"NodeName={name} " in ln + " "), "")
    m = _STATE.search(line)
    if not m:
        return None
    r = _REASON.search(line)
    reason = r.group(1).strip() if r else ""
    return NodeState(name=name, flags=tuple(m.group(1).upper().replace("*", "").split("+")), reason=reason)


def drain_reason(report: Report, prefix: str) -> str:
    return headline(report, limit=REASON_MAX, prefix=prefix)


def ours(state: NodeState, prefix: str) -> bool:
    return state.reason.startswith(f"{prefix}:")


def decide(report: Report, state: NodeState, prefix: str) -> Action:
    """What to do with this node, given this run's verdict and the node's state in Slurm. Pure."""
    name = state.name
    if report.verdict.ready:
        if state.drained and ours(state, prefix):
            return Action("resume", name, f"resume {name}: healthy again (was: {state.reason})")
        if state.drained or state.down:
            return Action("leave", name, f"{name} is healthy but left as it is: not drained by {prefix}")
        return Action("none", name, f"{name} healthy")
    reason = drain_reason(report, prefix)
    if state.drained and ours(state, prefix):
        if state.reason == reason:
            return Action("none", name, f"{name} stays drained: {reason}", reason)
        return Action("drain", name, f"{name} drained again with a new reason: {reason}", reason)
    if state.drained or state.down:
        why = f" ({state.reason})" if state.reason else ""
        return Action("leave", name, f"{name} is already {'+'.join(state.flags)}{why}: not ours, left alone")
    return Action("drain", name, f"drain {name}: {reason}", reason)


def apply(
    report: Report, settings: SlurmSettings, runner: Runner = run_cmd, environ: dict | None = None
) -> Action:
    """Read the node's state, decide, and drain or resume through scontrol."""
    name = node_name(settings, environ)
    shown = runner([settings.scontrol, "-o", "show", "node", name], SCONTROL_TIMEOUT_S)
    if not isinstance(shown, CmdResult) or shown.rc != 0:
        return Action("error", name, f"scontrol show node {name} failed: {_why(shown)}")
    state = parse_node(shown.stdout, name)
    if state is None:
        return Action("error", name, f"scontrol show node {name}: no State= in its answer")
    action = decide(report, state, settings.reason_prefix)
    if action.kind == "drain":
        argv = [settings.scontrol, "update", f"nodename={name}", "state=drain", f"reason={action.reason}"]
    elif action.kind == "resume":
        argv = [settings.scontrol, "update", f"nodename={name}", "state=resume"]
    else:
        return action
    done = runner(argv, SCONTROL_TIMEOUT_S)
    if not isinstance(done, CmdResult) or done.rc != 0:
        return Action("error", name, f"scontrol update nodename={name} failed: {_why(done)}", action.reason)
    return action


def _why(r: Any) -> str:
    """scontrol's last line of complaint, its exit code when it said nothing, or why it could not run."""
    if not isinstance(r, CmdResult):
        return str(getattr(r, "reason", r))
    said = (r.stderr or r.stdout).strip()
    return said.splitlines()[-1] if said else f"rc {r.rc}"
