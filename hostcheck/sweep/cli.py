"""``hostcheck sweep``: one process per node, started by the launcher the cluster already uses (torchrun, srun, a
PyTorchJob or JobSet), measures every node against its peers and names the bad node or link (docs/sweep.md).

Each node's process reads its place in the job (hostcheck.sweep.contract), starts its ranks in the training
Python (hostcheck.sweep.ranks), and waits for them; rank 0's node judges the record (hostcheck.sweep.judge),
prints the report, writes ``--json`` and, with ``--slurm-drain``, drains what it named. Exit codes: 0 nothing
named; 1 a node or link named, a node missing, or nothing could be judged; 2 usage or environment error (a
contract variable, the port, the training Python), 129/130/143 on a signal. Every other node exits 0 when its
part ran, 1 when the sweep ended early, 2 when it could not take part.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import tempfile
import time
from argparse import ArgumentError
from typing import Any

from hostcheck import config, infile, slurm
from hostcheck.argtypes import seconds
from hostcheck.check.render.summary import clean, fit
from hostcheck.child.launch import ProbeRun, python_arg
from hostcheck.exitcodes import EXIT_NOT_READY, EXIT_OK, EXIT_USAGE
from hostcheck.gather import DEFAULT_ENV_FILE, gather_tuning_env
from hostcheck.gather.facts import gather_facts
from hostcheck.gather.torchinfo import choose_python
from hostcheck.inside import sweep_plan as plan
from hostcheck.outfile import paths_error, write_report
from hostcheck.report import now_iso
from hostcheck.sweep import ranks
from hostcheck.sweep.contract import DEFAULT_PORT, Contract, ContractError, derive
from hostcheck.sweep.judge import Judgement, judge
from hostcheck.sweep.record import record_errors
from hostcheck.sweep.render import build_report, exit_code, render_json, render_text

SUMMARY = "run on every node of a job: name the slow node or link against its peers (docs/sweep.md)"
DESCRIPTION = (
    "Run one per node under torchrun, srun or a PyTorchJob: each node's compute rate, node-to-node bandwidth and "
    "latency in rounds of disjoint pairs, all_reduce across the group and its halves, judged against the peers; "
    "rank 0 names the slow node or link with the evidence and the fix."
)
EPILOG = (
    "Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, PyTorchJob) or SLURM_PROCID, SLURM_NTASKS, "
    "SLURM_JOB_NODELIST (srun). Exit codes: 0 nothing named, 1 a node or link named (or a node missing, or too few "
    "peers to judge), 2 usage or environment error, 129/130/143 SIGHUP/SIGINT/SIGTERM. Docs: docs/sweep.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="rank 0 writes the JSON report to PATH")
    out.add_argument(
        "-q", "--quiet", action="store_true", help="no text report (rank 0) or status line (others)"
    )
    run = p.add_argument_group("operations")
    config.add_option(run)
    run.add_argument(
        "--slurm-drain",
        action="store_true",
        help="rank 0 drains the nodes it names, a link's two ends included (only nodes in service: admin states untouched)",
    )
    run.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="N",
        help="MASTER_PORT under srun when it is unset (default 29500)",
    )
    run.add_argument(
        "--join-timeout",
        type=seconds,
        default=120.0,
        metavar="S",
        help="how long rank 0 waits for every node to join (default 120)",
    )
    run.add_argument(
        "--op-timeout",
        type=seconds,
        default=60.0,
        metavar="S",
        help="the longest one collective or exchange may take (default 60)",
    )
    run.add_argument(
        "--timeout",
        type=seconds,
        metavar="S",
        help="hard limit of this node's ranks (default: from the schedule)",
    )
    env = p.add_argument_group("environment")
    env.add_argument(
        "--python",
        metavar="PATH",
        type=python_arg,
        help="the training Python (default: the venv in the facts)",
    )
    env.add_argument("--facts-dir", default="/etc/ansible/facts.d", metavar="DIR", help="Ansible local facts")
    env.add_argument(
        "--env-file", metavar="PATH", help=f"training environment file (default: {DEFAULT_ENV_FILE})"
    )
    env.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cuda: one NCCL rank per GPU; cpu: one gloo rank (default auto)",
    )
    sched = p.add_argument_group("schedule")
    sched.add_argument(
        "--all-pairs-max",
        type=int,
        default=64,
        metavar="N",
        help="every node pair up to N nodes, hypercube pairs above (default 64)",
    )
    sched.add_argument(
        "--message-bytes",
        type=int,
        metavar="N",
        help="bytes per pair exchange and all_reduce (default: 256 MiB NCCL, 4 MiB gloo)",
    )


def _fail(message: str) -> ArgumentError:
    return ArgumentError(None, message)


def _check_options(args: argparse.Namespace) -> None:
    if not 1 <= args.port <= 65535:
        raise _fail(f"--port {args.port}: give a port from 1 to 65535")
    if not 2 <= args.all_pairs_max <= 4096:
        raise _fail(f"--all-pairs-max {args.all_pairs_max}: give 2 to 4096 nodes")
    if args.message_bytes is not None and not 4 <= args.message_bytes <= 4 << 30:
        raise _fail(f"--message-bytes {args.message_bytes}: give 4 bytes to 4 GiB")
    bad = paths_error([("--json", args.json)])
    if bad:
        raise _fail(bad)


def rules_of(lines: Any) -> plan.Rules:
    """The peer rule's lines from the effective thresholds (hostcheck/data/thresholds.json, [thresholds])."""
    return plan.Rules(
        bw_fraction=1.0 - lines.sweep_link_tolerance,
        latency_factor=lines.sweep_latency_factor,
        compute_fraction=1.0 - lines.sweep_compute_tolerance,
        z=lines.sweep_outlier_z,
        min_peers=lines.sweep_min_peers,
    )


def port_free(port: int) -> str | None:
    """Why rank 0 cannot listen on ``port`` here (it is in use), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    "in use on this node (another sweep, or a job, listens there): give another MASTER_PORT"
                )
            return exc.strerror or str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    _check_options(args)
    try:
        contract = derive(os.environ, args.port)
    except ContractError as exc:
        raise _fail(str(exc)) from None
    try:
        fault = plan.parse_fault(os.environ.get(ranks.FAULT_VAR, ""))
    except ValueError as exc:
        raise _fail(f"{ranks.FAULT_VAR}: {exc}") from None
    if fault and args.slurm_drain:
        raise _fail(f"--slurm-drain with {ranks.FAULT_VAR} set: a planted test fault drains no node")
    try:
        cfg = config.from_args(args)
    except config.ConfigError as exc:
        raise _fail(str(exc)) from None
    rules = rules_of(cfg.thresholds)
    gpus = ranks.local_gpus(args.device, os.environ)
    if args.device == "cuda" and not gpus:
        raise _fail("--device cuda: no GPU on this node (no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES is empty)")
    if contract.rank == 0 and not contract.agent_store:
        busy = port_free(contract.master_port)
        if busy:
            raise _fail(f"MASTER_PORT {contract.master_port}: {busy}")
    facts = gather_facts(args.facts_dir)
    python, _source = choose_python(args.python, facts)
    env = gather_tuning_env(args.env_file or facts.get("gpunode_tuning", "env_file") or DEFAULT_ENV_FILE)
    lay = ranks.layout(
        contract,
        gpus,
        args.join_timeout,
        args.op_timeout,
        args.all_pairs_max,
        args.message_bytes,
        args.timeout,
    )
    slurm_node = slurm.node_name(cfg.slurm)
    wargs = [
        ranks.worker_args(contract, lay, g, args.all_pairs_max, rules, fault, slurm_node)
        for g in range(max(1, gpus))
    ]
    if contract.rank != 0:
        return _other_node(contract, ranks.start(python, wargs, env, lay.limit_s), args.quiet)
    # Rank 0's record goes to a file of an unguessable name that its worker creates only at the end (never over a
    # file, never through a link), read back bounded and removed: a SIGKILL while the ranks run leaves nothing.
    path = os.path.join(tempfile.gettempdir(), f"hostcheck-sweep-{secrets.token_hex(16)}.json")
    wargs[0]["record_path"] = path
    try:
        runs = ranks.start(python, wargs, env, lay.limit_s)
        return _rank0(args, contract, runs, rules, cfg, started)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _said(runs: list[ProbeRun]) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """Rank 0's record (when this node has it), the kinds the ranks reported, and what went wrong, rank by rank."""
    record = None
    kinds, problems = [], []
    for local, r in enumerate(runs):
        data = r.data
        if "record_file" in data:
            try:
                record = json.loads(
                    infile.read_text(str(data["record_file"]), MAX_RECORD_BYTES, follow=False)
                )
            except infile.ReadError as exc:
                kinds.append("record")
                problems.append(
                    f"rank 0's record {exc.why} (its bound: MAX_RECORD_BYTES, {MAX_RECORD_BYTES} bytes)"
                )
            except ValueError as exc:  # RecursionError is a RuntimeError: the JSON nests past Python's limit
                problems.append(f"rank 0's record is not JSON: {exc}")
            except RecursionError:
                problems.append("rank 0's record is not JSON: nested too deeply")
            continue
        if "record" in data:
            record = data["record"]
            continue
        kind = str(data.get("kind") or "")
        kinds.append(kind)
        if r.error:
            problems.append(f"rank {local} of this node {r.error}")
        elif data.get("error"):
            problems.append(f"rank {local} of this node: {data['error']}")
    return record, kinds, problems


#: Rank 0's record at most: 16,384 nodes of 8 GPUs are about 131,000 ranks' compute rows and 115,000 node pairs
#: with their retests, some 40 MiB (docs/sweep.md); a record past this is refused, naming the bound.
MAX_RECORD_BYTES = 256 << 20

#: The kinds of a rank's record that mean this node could not take part (exit 2): its environment, the port, or a
#: contract variable the nodes disagree on (WORLD_SIZE), or rank 0's record it could not write or read back.
SETUP_KINDS = ("torch", "port", "taken", "unreachable", "contract", "record")


def _other_node(contract: Contract, runs: list[ProbeRun], quiet: bool) -> int:
    _record, kinds, problems = _said(runs)
    where = f"node {contract.rank} of {contract.world} ({socket.gethostname()})"
    if not problems:
        if not quiet:
            print(f"hostcheck sweep: {where} measured; rank 0 at {contract.master_addr} writes the report")
        return EXIT_OK
    print(f"hostcheck sweep: {where}: {problems[0]}", file=sys.stderr)
    return (
        EXIT_USAGE if any(k in SETUP_KINDS for k in kinds) or any(r.error for r in runs) else EXIT_NOT_READY
    )


def _rank0(
    args: argparse.Namespace,
    contract: Contract,
    runs: list[ProbeRun],
    rules: plan.Rules,
    cfg: Any,
    started: float,
) -> int:
    record, kinds, problems = _said(runs)
    if record is None:
        why = problems[0] if problems else "rank 0 printed no record"
        print(f"hostcheck sweep: error: {why}", file=sys.stderr)
        return (
            EXIT_USAGE
            if any(k in SETUP_KINDS for k in kinds) or not problems or any(r.error for r in runs)
            else EXIT_NOT_READY
        )
    wrong = record_errors(record)
    if wrong:
        print(f"hostcheck sweep: error: rank 0's record is malformed: {'; '.join(wrong)}", file=sys.stderr)
        return EXIT_USAGE
    j = judge(record, rules)
    meta = {
        "time": now_iso(),
        "launcher": contract.launcher,
        "master": f"{contract.master_addr}:{contract.master_port}",
        "duration_s": round(time.monotonic() - started, 3),
        "thresholds": rules.to_dict(),
    }
    report = build_report(record, j, meta)
    code = exit_code(j)
    if args.json:
        try:
            write_report(args.json, render_json(report))
        except OSError as exc:
            print(f"hostcheck sweep: error: writing {args.json}: {exc.strerror or exc}", file=sys.stderr)
            code = EXIT_USAGE
    if not args.quiet:
        sys.stdout.write(render_text(report))
    if args.slurm_drain and _drain(j, cfg.slurm):
        return EXIT_USAGE
    return code


def _drain(j: Judgement, settings: Any) -> bool:
    """Drain every node a drained finding names (a link: both ends; Judgement.drained: none where a test fault was
    planted, only compute where ranks failed) through the node checks' safe path (admin states left alone); True
    when scontrol failed. A drained node gets no job, so no later sweep can clear it: the admin resumes it after the
    repair (docs/sweep.md)."""
    reasons: dict[str, str] = {}
    findings, held = j.drained()
    if held:
        with contextlib.suppress(OSError, ValueError):
            print(f"hostcheck sweep: slurm: {held}", file=sys.stderr)
    for f in findings:
        for i in f.nodes:
            reasons.setdefault(_slurm_name(j, i), _fit(f"{settings.reason_prefix}: {f.id} {f.brief}"))
    failed = False
    for name, reason in reasons.items():
        action = slurm.apply_verdict(name, False, reason, settings, sweep=True)
        failed |= action.kind == "error"
        with contextlib.suppress(OSError, ValueError):
            print(f"hostcheck sweep: slurm: {action.message}", file=sys.stderr)
    return failed


def _slurm_name(j: Judgement, node: int) -> str:
    row = next(n for n in j.nodes if n["node"] == node)
    return str(row.get("slurm_node") or str(row.get("host") or "").split(".", 1)[0])


def _fit(reason: str) -> str:
    return fit(clean(reason), config.REASON_MAX)
