"""``--slurm-drain``: drain this node through scontrol when it is not ready, resume it once it is.

Like LBNL NHC, hostcheck marks its own drains with a reason prefix (``hostcheck: gpu.E005 ...``) and resumes
only a node whose reason carries it. It changes a node's state only when the node is plainly in service or
drained by hostcheck: every state flag that is someone else's (an admin's FAIL, a maintenance reservation, a
pending reboot, power saving, ...) leaves the node alone, and the run says so. What each Slurm state means for
hostcheck is data (``hostcheck/data/slurm_states.json``, each row with Slurm's documentation as its source),
read once at import; a malformed file raises ``ValueError`` naming the row.

Gathering (``scontrol --json show node`` where the installed Slurm has it, 23.02 and later, else
``scontrol -o show node``) is separate from deciding (:func:`decide`, pure), so the tests drive every state
through fixtures.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostcheck.check.render.summary import headline
from hostcheck.config import REASON_MAX, SlurmSettings
from hostcheck.gather.base import CmdResult, Runner, run_cmd
from hostcheck.report import Report

SCONTROL_TIMEOUT_S = 15.0
DATA_PATH = Path(__file__).resolve().parent / "data" / "slurm_states.json"
#: What hostcheck does with a node whose state carries a name: ``serve`` (in service: drained when not ready),
#: ``drain`` (resumed or re-drained only when the reason is hostcheck's), ``leave`` (never changed).
SERVE, DRAIN, LEAVE = "serve", "drain", "leave"
_ACTIONS = (SERVE, DRAIN, LEAVE)
_ROW_KEYS = {"name", "kind", "action", "meaning", "source"}
# scontrol's own stamp after the first line of a reason: " [user@2026-11-24T10:05:00]" (the first such one), or
# in another SLURM_TIME_FORMAT " [user@anything]" (the last one).
_STAMP = re.compile(r" \[[^\s\[\]@]+@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\]")
_ANY_STAMP = re.compile(r" \[[^\s\[\]@]+@[^\[\]]+\]")
_STATE = re.compile(r"(?:^| )State=(\S+)")


@dataclass(frozen=True)
class SlurmState:
    """One row of the data file: a base state or a flag, as scontrol prints it, and what hostcheck does."""

    name: str
    kind: str  # base | flag
    action: str  # SERVE | DRAIN | LEAVE
    meaning: str
    source: str


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {what}")


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _load(path: Path) -> dict[str, SlurmState]:
    """The state table of ``path`` by name; ValueError naming the file and the row."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        _need(isinstance(data, dict) and data.get("schema") == 1, "top level", "an object with schema 1")
        for key in ("about", "source"):
            _need(_text(data.get(key)), "top level", f"{key} must be a non-empty string")
        rows = data.get("states")
        _need(isinstance(rows, list) and bool(rows), "states", "a non-empty list of rows")
        table: dict[str, SlurmState] = {}
        for i, row in enumerate(rows):
            where = f"states[{i}]"
            _need(isinstance(row, dict), where, "a row is an object")
            unknown = sorted(set(row) - _ROW_KEYS)
            _need(not unknown, where, f"unknown keys {unknown}")
            name = row.get("name")
            _need(
                isinstance(name, str) and re.fullmatch(r"[A-Z][A-Z_]*", name) is not None,
                where,
                "name must be a state as scontrol prints it (upper case)",
            )
            where = f"{where} ({name})"
            _need(row.get("kind") in ("base", "flag"), where, "kind must be base or flag")
            _need(row.get("action") in _ACTIONS, where, f"action must be one of {', '.join(_ACTIONS)}")
            _need(_text(row.get("meaning")), where, "meaning must be a non-empty string")
            _need(
                isinstance(row.get("source"), str) and row["source"].startswith("https://"),
                where,
                "source must be the public document it comes from (https://...)",
            )
            _need(name not in table, where, "duplicate name")
            table[name] = SlurmState(name, row["kind"], row["action"], row["meaning"], row["source"])
        _need(
            any(s.kind == "base" and s.action == SERVE for s in table.values()),
            "states",
            "no base state in service",
        )
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return table


#: Every Slurm state hostcheck knows, by the name scontrol prints.
STATES = _load(DATA_PATH)


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
    def not_ours(self) -> tuple[str, ...]:
        """The states that are someone else's (the table's ``leave``), and any the table does not know."""
        return tuple(f for f in self.flags if f not in STATES or STATES[f].action == LEAVE)


@dataclass(frozen=True)
class Action:
    """What --slurm-drain did: ``drain``, ``resume``, ``none`` (nothing to do), ``leave`` (someone else's state),
    or ``error`` (scontrol failed)."""

    kind: str
    node: str
    message: str
    reason: str = ""


def node_name(settings: SlurmSettings, environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    return settings.node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def _flags(words: Any) -> tuple[str, ...]:
    # sinfo's suffixes (DOWN*: not responding) are not scontrol's, but cost nothing to drop.
    return tuple(w.strip().upper().replace("*", "") for w in words if w.strip())


def parse_node(text: str, name: str) -> NodeState | None:
    """The state and reason from ``scontrol -o show node NAME`` (one line), or None when it says nothing.

    The reason is the last field but Comment= and Extra=, and scontrol stamps its first line with
    `` [user@time]``: it runs from ``Reason=`` to that stamp, whatever it holds (`` Word=`` included)."""
    line = next((ln for ln in text.splitlines() if ln.startswith(f"NodeName={name} ")), "")
    at = line.find(" Reason=")
    head, rest = (line, "") if at < 0 else (line[:at], line[at + len(" Reason=") :])
    m = _STATE.search(head)
    if not m:
        return None
    stamp = _STAMP.search(rest) or next(reversed(list(_ANY_STAMP.finditer(rest))), None)
    if stamp:
        reason = rest[: stamp.start()]
    else:  # a reason without its stamp: up to the optional fields that follow it
        ends = [i for i in (rest.find(" Comment="), rest.find(" Extra=")) if i >= 0]
        reason = rest[: min(ends)] if ends else rest
    return NodeState(name=name, flags=_flags(m.group(1).split("+")), reason=reason.strip())


def parse_json(text: str, name: str) -> NodeState | None:
    """The state and reason from ``scontrol --json show node NAME`` (Slurm 23.02 and later: ``nodes``, each with
    ``name``, ``state`` as a list of words and ``reason``), or None when it does not hold this node."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    for node in nodes if isinstance(nodes, list) else ():
        if not isinstance(node, dict) or node.get("name") != name:
            continue
        state, reason = node.get("state"), node.get("reason")
        if isinstance(state, str):
            state = state.split("+")
        if not isinstance(state, list) or not state or not all(isinstance(w, str) for w in state):
            return None
        return NodeState(
            name=name, flags=_flags(state), reason=reason.strip() if isinstance(reason, str) else ""
        )
    return None


def drain_reason(report: Report, prefix: str) -> str:
    return headline(report, limit=REASON_MAX, prefix=prefix)


#: The drains of ``hostcheck sweep`` (reason ``<prefix>: sweep.S...``): a node's own checks cannot see what the
#: sweep saw (a link, a node slower than its peers), so only a sweep resumes them.
SWEEP = "sweep."


def ours(state: NodeState, prefix: str, sweep: bool = False) -> bool:
    """Whether the node's drain is this command's: the sweep's (``sweep``) or the node checks' (every other
    reason that carries the prefix)."""
    return state.reason.startswith(f"{prefix}:") and state.reason.startswith(f"{prefix}: {SWEEP}") == sweep


def decide(report: Report, state: NodeState, prefix: str) -> Action:
    """What to do with this node, given this run's verdict and the node's state in Slurm. Pure."""
    reason = "" if report.verdict.ready else drain_reason(report, prefix)
    return decide_verdict(report.verdict.ready, reason, state, prefix)


def decide_verdict(ready: bool, reason: str, state: NodeState, prefix: str, sweep: bool = False) -> Action:
    """:func:`decide` for any verdict: ``ready``, else drained with ``reason``; ``sweep``: the sweep's drains are
    ours, the node checks' are not (and the reverse without it). Pure."""
    name = state.name
    why = f" ({state.reason})" if state.reason else ""
    others = state.not_ours
    if others:
        verdict = "healthy" if ready else "not ready"
        return Action(
            "leave",
            name,
            f"{name} is {verdict} but left as it is: {'+'.join(state.flags)}{why}; "
            f"{', '.join(others)} is not {prefix}'s to change",
        )
    if ready:
        if state.drained and ours(state, prefix, sweep):
            return Action("resume", name, f"resume {name}: healthy again (was: {state.reason})")
        if state.drained:
            who = f"{prefix} sweep" if sweep else prefix
            return Action("leave", name, f"{name} is healthy but left as it is: not drained by {who}")
        return Action("none", name, f"{name} healthy")
    if state.drained and ours(state, prefix, sweep):
        if state.reason == reason:
            return Action("none", name, f"{name} stays drained: {reason}", reason)
        return Action("drain", name, f"{name} drained again with a new reason: {reason}", reason)
    if state.drained:
        return Action("leave", name, f"{name} is already {'+'.join(state.flags)}{why}: not ours, left alone")
    return Action("drain", name, f"drain {name}: {reason}", reason)


def read_node(settings: SlurmSettings, name: str, runner: Runner = run_cmd) -> NodeState | Action:
    """The node's state in Slurm: ``scontrol --json`` where the installed Slurm has it (23.02 and later; 22.05
    refuses the option), else ``scontrol -o``; an ``error`` Action when neither answers."""
    shown = runner([settings.scontrol, "--json", "show", "node", name], SCONTROL_TIMEOUT_S)
    if isinstance(shown, CmdResult) and shown.rc == 0:
        state = parse_json(shown.stdout, name)
        if state is not None:
            return state
    shown = runner([settings.scontrol, "-o", "show", "node", name], SCONTROL_TIMEOUT_S)
    if not isinstance(shown, CmdResult) or shown.rc != 0:
        return Action("error", name, f"scontrol show node {name} failed: {_why(shown)}")
    state = parse_node(shown.stdout, name)
    if state is None:
        return Action("error", name, f"scontrol show node {name}: no State= in its answer")
    return state


def apply(
    report: Report, settings: SlurmSettings, runner: Runner = run_cmd, environ: dict | None = None
) -> Action:
    """Read the node's state, decide, and drain or resume through scontrol."""
    name = node_name(settings, environ)
    state = read_node(settings, name, runner)
    if isinstance(state, Action):
        return state
    return carry_out(decide(report, state, settings.reason_prefix), settings, runner)


def apply_verdict(
    name: str,
    ready: bool,
    reason: str,
    settings: SlurmSettings,
    runner: Runner = run_cmd,
    sweep: bool = False,
) -> Action:
    """:func:`apply` for node ``name`` and any verdict (``hostcheck sweep`` on the nodes it judged)."""
    state = read_node(settings, name, runner)
    if isinstance(state, Action):
        return state
    return carry_out(decide_verdict(ready, reason, state, settings.reason_prefix, sweep), settings, runner)


def carry_out(action: Action, settings: SlurmSettings, runner: Runner = run_cmd) -> Action:
    """The drain or resume ``action`` asks for, through scontrol."""
    name = action.node
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
