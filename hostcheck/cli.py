"""``hostcheck check`` (also plain ``hostcheck``, the default command): check a provisioned GPU node and print
a readiness score. The command line around it (exit 2 on usage errors, signals, --debug) is hostcheck.command.

Exit codes: 0 ready, 1 not ready, 2 usage or environment error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from argparse import ArgumentError
from typing import Any

# The gatherers are called through their module (gather.gather): tests replace hostcheck.gather.gather.
from hostcheck import SCHEMA_VERSION, gather
from hostcheck.argtypes import duration, seconds
from hostcheck.checks import all_checks
from hostcheck.child.launch import python_arg
from hostcheck.gather.workload import DEFAULT_SECTIONS
from hostcheck.outfile import paths_error, write_report
from hostcheck.registry import Check, Result, run_checks, select
from hostcheck.render.json import render_json
from hostcheck.render.junit import render_junit
from hostcheck.render.prometheus import render_prometheus
from hostcheck.render.text import render_list, render_text
from hostcheck.report import Report, host_info, now_iso, versions
from hostcheck.score import FAIL_LEVELS, Verdict, verdict

EXIT_READY, EXIT_NOT_READY, EXIT_USAGE = 0, 1, 2

SUMMARY = "check this node and print a readiness score (the default command)"
DESCRIPTION = (
    "Check a gpunode GPU node after provisioning: versions, GPU health, host tuning. "
    "Prints a readiness score 0-100 and a fix for every shortfall."
)
EPILOG = "Exit codes: 0 ready, 1 not ready, 2 usage or environment error, 130/143 SIGINT/SIGTERM. Docs: docs/hostcheck.md."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """check's options (on the top-level parser too: check is the default command)."""
    out = p.add_argument_group("output")
    out.add_argument(
        "--json", action="store_true", help="print the JSON document (schema_version 1) instead of text"
    )
    out.add_argument(
        "--prometheus", metavar="PATH", help="also write a node_exporter textfile (.prom) to PATH"
    )
    out.add_argument("--junit", metavar="PATH", help="also write JUnit XML to PATH")
    out.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour (default: auto)"
    )
    out.add_argument("-v", "--verbose", action="store_true", help="show per-GPU details under each check")
    sel = p.add_argument_group("selection")
    sel.add_argument("--list", action="store_true", help="list the checks and exit")
    sel.add_argument(
        "--only", action="append", metavar="ID|CATEGORY", help="run only these (comma list, repeatable)"
    )
    sel.add_argument(
        "--skip", action="append", metavar="ID|CATEGORY", help="skip these (comma list, repeatable)"
    )
    sel.add_argument("--quick", action="store_true", help="leave out the workload checks (GPU jobs)")
    ver = p.add_argument_group("verdict")
    ver.add_argument(
        "--fail-level",
        choices=tuple(FAIL_LEVELS),
        default="fail",
        help="not ready when any check is at this level or worse (errors count as fail; default: fail)",
    )
    ver.add_argument(
        "--min-score", type=int, default=0, metavar="N", help="not ready when the score is below N"
    )
    env = p.add_argument_group("environment")
    env.add_argument(
        "--expect-gpus", type=int, metavar="N", help="GPUs this node must have (default: local facts)"
    )
    env.add_argument(
        "--python",
        metavar="PATH",
        type=python_arg,
        help="the training Python to probe (default: the venv in the facts)",
    )
    env.add_argument("--facts-dir", default="/etc/ansible/facts.d", metavar="DIR", help="Ansible local facts")
    env.add_argument(
        "--env-file", metavar="PATH", help="training environment file (default: /etc/gpunode/training.env)"
    )
    env.add_argument(
        "--timeout", type=seconds, default=30.0, metavar="S", help="per-check timeout (default 30)"
    )
    env.add_argument(
        "--torch-timeout",
        type=seconds,
        default=90.0,
        metavar="S",
        help="timeout of the torch probe (default 90)",
    )
    wl = p.add_argument_group("workload")
    wl.add_argument(
        "--burn", type=duration, default=0.0, metavar="SECONDS", help="add a matmul stress run of this length"
    )
    wl.add_argument(
        "--workload-timeout",
        type=seconds,
        default=180.0,
        metavar="S",
        help="hard limit of the workload probe process (default 180)",
    )
    wl.add_argument(
        "--nnodes", metavar="N", help="multi-node DDP check through torchrun (with --rdzv-endpoint)"
    )
    wl.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous, the same on every node")
    wl.add_argument(
        "--rdzv-id", default="hostcheck", metavar="ID", help="rendezvous id, the same on every node"
    )
    wl.add_argument("--nproc-per-node", type=int, metavar="N", help="ranks per node (default: one per GPU)")
    wl.add_argument(
        "--rdzv-timeout",
        type=seconds,
        default=300.0,
        metavar="S",
        help="hard limit of the multi-node run, rendezvous included (default 300)",
    )
    wl.add_argument(
        "--workload-device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where the workload runs (default auto: the GPUs when CUDA works)",
    )
    wl.add_argument(
        "--workload-sections",
        metavar="LIST",
        help=f"comma-separated subset of {','.join(DEFAULT_SECTIONS)} (checks of the others are skipped)",
    )
    wl.add_argument(
        "--workload-section-args",
        metavar="JSON",
        help='per-section probe arguments, e.g. \'{"matmul": {"n": 8192, "measure_s": 2}}\'',
    )


def _split(values: list[str] | None) -> list[str]:
    return [x.strip() for v in values or [] for x in v.split(",") if x.strip()]


def evaluate(
    snapshot: Any, checks: list[Check], fail_level: str = "fail", min_score: int = 0, timeout_s: float = 30.0
) -> tuple[list[Result], Verdict]:
    """Judge a gathered snapshot: the pure half of a run (tests call this with fixture snapshots)."""
    results = run_checks(checks, snapshot, timeout_s)
    return results, verdict(results, fail_level=fail_level, min_score=min_score)


def build_report(snapshot: Any, results: list[Result], v: Verdict, started: float, when: str) -> Report:
    return Report(
        results=tuple(results),
        verdict=v,
        host=host_info(snapshot),
        versions=versions(snapshot),
        time=when,
        duration_s=time.monotonic() - started,
        exit_code=EXIT_READY if v.ready else EXIT_NOT_READY,
    )


def run(args: argparse.Namespace) -> int:
    """``hostcheck check``: select, gather, judge, report. Usage errors raise argparse.ArgumentError."""
    started = time.monotonic()
    try:
        checks = select(all_checks(), _split(args.only), _split(args.skip), args.quick)
    except ValueError as exc:
        raise ArgumentError(None, str(exc)) from None
    if args.list:
        if args.json:
            rows = [
                {
                    "id": c.id,
                    "title": c.title,
                    "category": c.category,
                    "weight": c.weight,
                    "workload": c.workload,
                }
                for c in checks
            ]
            sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, "checks": rows}, indent=2) + "\n")
            return EXIT_READY
        sys.stdout.write(render_list(checks))
        return EXIT_READY
    if not checks:
        raise ArgumentError(None, "no checks selected")
    if args.expect_gpus is not None and args.expect_gpus < 0:
        raise ArgumentError(None, "--expect-gpus must be >= 0")
    if not 0 <= args.min_score <= 100:
        raise ArgumentError(None, "--min-score must be 0-100")
    if bool(args.nnodes) != bool(args.rdzv_endpoint):
        raise ArgumentError(None, "--nnodes and --rdzv-endpoint go together")
    if args.nnodes and not re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", args.nnodes):
        raise ArgumentError(None, "--nnodes takes N or MIN:MAX, e.g. 3 or 2:4")
    if args.rdzv_endpoint and not re.fullmatch(r"[^\s:]+:[0-9]{1,5}", args.rdzv_endpoint):
        raise ArgumentError(None, "--rdzv-endpoint takes HOST:PORT")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise ArgumentError(None, "--nproc-per-node must be >= 1")
    sections = tuple(_split([args.workload_sections])) if args.workload_sections else DEFAULT_SECTIONS
    unknown = sorted(set(sections) - set(DEFAULT_SECTIONS))
    if unknown:
        raise ArgumentError(None, f"--workload-sections: unknown section(s) {', '.join(unknown)}")
    section_args = _section_args(args.workload_section_args)
    if args.quick and (args.burn or args.nnodes):
        raise ArgumentError(None, "--quick leaves the workload out: it cannot go with --burn or --nnodes")
    if args.python and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ArgumentError(None, f"--python {args.python}: not an executable file")
    if sys.stdout is None:
        raise ArgumentError(None, "standard output is closed: nowhere to print the report")
    tmp_error = _temp_dir_error()
    if tmp_error:
        raise ArgumentError(None, tmp_error)
    bad_path = paths_error([("--prometheus", args.prometheus), ("--junit", args.junit)])
    if bad_path:
        raise ArgumentError(None, bad_path)

    options = gather.Options(
        expect_gpus=args.expect_gpus,
        python=args.python,
        facts_dir=args.facts_dir,
        env_file=args.env_file,
        torch_timeout_s=args.torch_timeout,
        burn=args.burn,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        nproc_per_node=args.nproc_per_node,
        workload_timeout_s=args.workload_timeout,
        rdzv_timeout_s=args.rdzv_timeout,
        workload_device=args.workload_device,
        workload_sections=sections,
        workload_section_args=section_args,
    )
    needs = set().union(*(c.needs for c in checks)) & set(gather.GATHERERS)
    when = now_iso()
    snapshot = gather.gather(options, needs)
    results, v = evaluate(snapshot, checks, args.fail_level, args.min_score, args.timeout)
    report = build_report(snapshot, results, v, started, when)
    return emit(report, args)


def _section_args(text: str | None) -> dict[str, Any] | None:
    """--workload-section-args: a JSON object of objects, one per section."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ArgumentError(None, f"--workload-section-args is not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ArgumentError(
            None, '--workload-section-args takes an object of objects, e.g. {"matmul": {"n": 8192}}'
        )
    unknown = sorted(set(value) - set(DEFAULT_SECTIONS))
    if unknown:
        raise ArgumentError(None, f"--workload-section-args: unknown section(s) {', '.join(unknown)}")
    return value


def _temp_dir_error() -> str | None:
    """Children's output goes to temporary files: an unusable TMPDIR is a usage error before the run."""
    try:
        with tempfile.TemporaryFile():
            pass
    except OSError as exc:
        where = os.environ.get("TMPDIR") or "the temporary folder"
        return f"cannot create a temporary file in {where} ({exc.strerror or exc}): set TMPDIR to a writable folder"
    return None


def emit(report: Report, args: argparse.Namespace) -> int:
    try:
        if args.prometheus:
            write_report(args.prometheus, render_prometheus(report))
        if args.junit:
            write_report(args.junit, render_junit(report))
    except OSError as exc:
        print(f"hostcheck: error: writing a report file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.json:
            sys.stdout.write(render_json(report))
        else:
            colour = args.color == "always" or (
                args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            )
            sys.stdout.write(render_text(report, colour=colour, verbose=args.verbose))
        sys.stdout.flush()
    except BrokenPipeError:  # `hostcheck | head`: the reader left; the verdict still stands
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError as exc:  # a full disk, /dev/full: the report did not reach its reader
        print(f"hostcheck: error: writing the report: {exc.strerror or exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_USAGE
    return report.exit_code
