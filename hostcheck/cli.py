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
import threading
import time
from argparse import ArgumentError
from typing import Any

# The gatherers are called through their module (gather.gather): tests replace hostcheck.gather.gather.
from hostcheck import SCHEMA_VERSION, config, gather, slurm
from hostcheck.argtypes import duration, positive, seconds
from hostcheck.checks import all_checks
from hostcheck.child.launch import kill_all, python_arg, reopen
from hostcheck.exitcodes import EXIT_NOT_READY, EXIT_OK, EXIT_USAGE
from hostcheck.gather.workload import DEFAULT_SECTIONS
from hostcheck.outfile import paths_error, write_report
from hostcheck.profiles import DEFAULT_PROFILE, PROFILES, merge_section_args, workload_args
from hostcheck.registry import Check, Result, run_checks, select
from hostcheck.render.json import render_json
from hostcheck.render.junit import render_junit
from hostcheck.render.prometheus import read_last_success, render_prometheus
from hostcheck.render.summary import render_summary
from hostcheck.render.text import render_list, render_text
from hostcheck.report import Report, gpu_records, host_info, now_iso, versions
from hostcheck.score import FAIL_LEVELS, Verdict, verdict

SUMMARY = "check this node and print a readiness score (the default command)"
DESCRIPTION = (
    "Check a gpunode GPU node after provisioning: versions, GPU health, host tuning. "
    "Prints a readiness score 0-100 and a fix for every shortfall."
)
EPILOG = "Exit codes: 0 ready, 1 not ready, 2 usage or environment error, 129/130/143 SIGHUP/SIGINT/SIGTERM. Docs: docs/hostcheck.md."


# long: one option after another, each with its help, in --help's order; splitting it belongs to the subcommand packages
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
    out.add_argument(
        "--summary",
        action="store_true",
        help="print one line (at most 80 characters: node-problem-detector's limit) instead of the report",
    )
    run = p.add_argument_group("operations")
    run.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML settings (default: {config.DEFAULT_PATH} when it exists); options given here win",
    )
    run.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        help="passive: reads only, for Slurm's HealthCheckProgram; prolog/epilog: short, exit non-zero only; "
        "full: everything (default); burnin: full plus a 10-minute stress run",
    )
    run.add_argument(
        "--deadline",
        type=seconds,
        metavar="S",
        help="the whole run ends by then; what is not done is cut off as an error (default: the profile's)",
    )
    run.add_argument(
        "--slurm-drain",
        action="store_true",
        default=None,
        help="drain this Slurm node when not ready and resume it when ready (only drains hostcheck made)",
    )
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
        help="not ready when any check is at this level or worse (errors count as fail; default: fail)",
    )
    ver.add_argument(
        "--min-score", type=int, metavar="N", help="not ready when the score is below N (default 0)"
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
        "--state-file",
        metavar="PATH",
        help="the counters of the last run, for 'rising since the last run' "
        "(default: [hardware] state_file, else /var/lib/hostcheck/state.json)",
    )
    env.add_argument(
        "--host-root",
        default="/",
        metavar="DIR",
        help="where the node's /sys and /proc are read for the host hardware checks (a fixture tree in tests)",
    )
    env.add_argument(
        "--env-file", metavar="PATH", help="training environment file (default: /etc/gpunode/training.env)"
    )
    env.add_argument(
        "--timeout", type=seconds, default=30.0, metavar="S", help="per-check timeout (default 30)"
    )
    env.add_argument(
        "--data-dir",
        action="append",
        metavar="DIR",
        help="a dataset directory to judge (system.E005; repeatable; default: data_dirs in gpunode_tuning.fact)",
    )
    env.add_argument(
        "--data-rate",
        type=positive,
        metavar="MB/S",
        help="the read rate the input pipeline needs from each dataset directory (default: 270 MB/s per GPU)",
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
        "--burn",
        type=duration,
        metavar="SECONDS",
        help="add a matmul stress run of this length (default: the profile's; burnin 600)",
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
    snapshot: Any,
    checks: list[Check],
    fail_level: str = "fail",
    min_score: int = 0,
    timeout_s: float = 30.0,
    deadline: float | None = None,
) -> tuple[list[Result], Verdict]:
    """Judge a gathered snapshot: the pure half of a run (tests call this with fixture snapshots)."""
    results = run_checks(checks, snapshot, timeout_s, deadline)
    return results, verdict(results, fail_level=fail_level, min_score=min_score)


def build_report(
    snapshot: Any, results: list[Result], v: Verdict, started: float, when: str, profile: str = ""
) -> Report:
    return Report(
        results=tuple(results),
        verdict=v,
        host=host_info(snapshot),
        versions=versions(snapshot),
        time=when,
        duration_s=time.monotonic() - started,
        exit_code=EXIT_OK if v.ready else EXIT_NOT_READY,
        gpus=gpu_records(snapshot),
        profile=profile,
    )


# long: select, gather, judge, report in order with each option's usage error (one frozen request would move those out)
def run(args: argparse.Namespace) -> int:
    """``hostcheck check``: select, gather, judge, report. Usage errors raise argparse.ArgumentError."""
    started = time.monotonic()
    cfg = _settle(args)
    profile = PROFILES[args.profile]
    try:
        checks = select(all_checks(), _split(args.only), _split(args.skip), args.quick)
    except ValueError as exc:
        raise ArgumentError(None, str(exc)) from None
    named = {x.lower() for x in _split(args.only)}
    outside = [c.id for c in checks if c.id.lower() in named and not profile.allows(c.needs)]
    if outside:
        raise ArgumentError(
            None,
            f"{outside[0]} does not run in the {profile.name} profile: it starts a child "
            "or a GPU job; choose --profile full",
        )
    allowed = [c for c in checks if profile.allows(c.needs)]
    if checks and not allowed:
        raise ArgumentError(None, f"the {profile.name} profile runs none of the selected checks")
    checks = allowed
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
            return EXIT_OK
        sys.stdout.write(render_list(checks))
        return EXIT_OK
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
    # The sizes follow the profile's time budget; what the command line names wins.
    section_args = merge_section_args(workload_args(profile), _section_args(args.workload_section_args))
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

    deadline = started + (args.deadline or profile.deadline_s)
    options = gather.Options(
        deadline=deadline,
        config=cfg,
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
        data_dirs=tuple(args.data_dir or ()),
        data_rate_mb_s=args.data_rate,
        host_root=args.host_root,
        state_file=args.state_file,
    )
    needs = set().union(*(c.needs for c in checks)) & set(gather.GATHERERS)
    when = now_iso()
    with _Watchdog(deadline, profile.name):
        snapshot = gather.gather(options, needs)
        # Children of gatherers the deadline cut off die now, not at their own limits; nothing new starts.
        overran = time.monotonic() >= deadline
        if overran:
            kill_all()
        results, v = evaluate(snapshot, checks, args.fail_level, args.min_score, args.timeout, deadline)
        report = build_report(snapshot, results, v, started, when, profile.name)
        code = emit(report, args)
        if args.slurm_drain:
            if overran:
                reopen()  # scontrol must still run: the verdict stands and Slurm must hear it
            action = slurm.apply(report, cfg.slurm)
            if overran:
                kill_all()
            print(f"hostcheck: slurm: {action.message}", file=sys.stderr)
            if action.kind == "error":
                return EXIT_USAGE
    return code


def _settle(args: argparse.Namespace) -> config.Config:
    """Read the configuration file and fill every option the command line left unset from it, then from the
    built-in defaults. A bad file is a usage error naming the file, the key and the reason."""
    try:
        cfg = config.load(args.config, explicit=args.config is not None)
    except config.ConfigError as exc:
        raise ArgumentError(None, f"{exc} (see --config and docs/operations.md)") from None
    args.profile = args.profile or cfg.profile or DEFAULT_PROFILE
    args.fail_level = args.fail_level or cfg.fail_level or "fail"
    if args.min_score is None:
        args.min_score = cfg.min_score or 0
    if args.expect_gpus is None:
        args.expect_gpus = cfg.expect_gpus
    args.only = args.only or list(cfg.only)
    args.skip = list(cfg.skip) + (args.skip or [])
    if args.prometheus is None:
        args.prometheus = cfg.prometheus
    args.slurm_drain = cfg.slurm.drain if args.slurm_drain is None else args.slurm_drain
    if args.burn is None:
        args.burn = PROFILES[args.profile].burn_s
    return cfg


class _Watchdog:
    """The last line of defence: a run still going well past its deadline (a check stuck where no timeout
    reaches) ends with exit 2 and every child killed, instead of holding the health check's slot."""

    GRACE_S = 15.0

    def __init__(self, deadline: float, profile: str) -> None:
        self.deadline, self.profile = deadline, profile
        self.timer: threading.Timer | None = None

    def __enter__(self) -> _Watchdog:
        wait = max(0.0, self.deadline - time.monotonic()) + self.GRACE_S
        self.timer = threading.Timer(wait, self.fire)
        self.timer.daemon = True
        with contextlib.suppress(RuntimeError):  # no thread to be had: the per-part deadlines still hold
            self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()
            # Let the timer's thread end now rather than wake while the interpreter finalizes.
            with contextlib.suppress(RuntimeError):  # never started
                self.timer.join(1.0)

    def fire(self) -> None:
        with contextlib.suppress(Exception):
            kill_all()
            sys.stderr.write(
                f"hostcheck: error: the {self.profile} profile's deadline passed {self.GRACE_S:g} s ago and the "
                "run is still not done; stopped\n"
            )
            sys.stderr.flush()
        os._exit(EXIT_USAGE)


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
            # The textfile is rewritten every run: a not-ready run keeps the last ready run's time.
            last = None if report.verdict.ready else read_last_success(args.prometheus)
            write_report(args.prometheus, render_prometheus(report, last))
        if args.junit:
            write_report(args.junit, render_junit(report))
    except OSError as exc:
        print(f"hostcheck: error: writing a report file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.summary:
            sys.stdout.write(render_summary(report))
        elif args.json:
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
