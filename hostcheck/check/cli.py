"""``hostcheck check`` (also plain ``hostcheck``, the default command): check a provisioned GPU node and print
a readiness score. The command line around it (exit 2 on usage errors, signals, --debug) is hostcheck.command.

Exit codes: 0 ready, 1 not ready, 2 usage or environment error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import replace

# The gatherers are called through their module (gather.gather): tests replace hostcheck.gather.gather.
from hostcheck import SCHEMA_VERSION, config, gather
from hostcheck.argtypes import duration, host_root, positive, seconds
from hostcheck.check.request import Output, Request, build_request
from hostcheck.checks import load
from hostcheck.child.launch import kill_all, python_arg, reopen
from hostcheck.core import build_report, evaluate
from hostcheck.exitcodes import EXIT_OK, EXIT_USAGE
from hostcheck.outfile import write_report
from hostcheck.profiles import DEFAULT_SECTIONS, PROFILES
from hostcheck.progress import progress
from hostcheck.registry import Timer
from hostcheck.report import Report, now_iso
from hostcheck.score import FAIL_LEVELS

SUMMARY = "check this node and print a readiness score (the default command)"
DESCRIPTION = (
    "Check a gpunode GPU node after provisioning: versions, GPU health, host tuning. "
    "Prints a readiness score 0-100 and a fix for every shortfall."
)
EPILOG = "Exit codes: 0 ready, 1 not ready, 2 usage or environment error, 129/130/143 SIGHUP/SIGINT/SIGTERM. Docs: docs/hostcheck.md."


# long: one option after another, each with its help, in --help's order; splitting it belongs to the subcommand packages
def add_arguments(p: argparse.ArgumentParser) -> None:
    """check's options (on the top-level parser too: check is the default command)."""
    _output_options(p)
    _operation_options(p)
    _selection_options(p)
    _verdict_options(p)
    _environment_options(p)
    _workload_options(p)


def _output_options(p: argparse.ArgumentParser) -> None:
    """Output: the report's form and the files written besides."""
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
    out.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show every check with its details (default: what falls short)",
    )
    out.add_argument(
        "--summary",
        action="store_true",
        help="print one line (at most 80 characters: node-problem-detector's limit) instead of the report",
    )


def _operation_options(p: argparse.ArgumentParser) -> None:
    """Operations: the configuration file, the profile, the deadline, Slurm."""
    run = p.add_argument_group("operations")
    config.add_option(run)
    run.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        help="passive: reads only, for Slurm's HealthCheckProgram; prolog/epilog: short, for Slurm's job prolog and "
        "epilog; standard (default): every check that runs no GPU job, within a minute; full: the GPU workload and "
        "DCGM's level-2 diagnostic too (minutes); burnin: full plus a 10-minute stress run",
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


def _selection_options(p: argparse.ArgumentParser) -> None:
    """Selection: which checks run."""
    sel = p.add_argument_group("selection")
    sel.add_argument("--list", action="store_true", help="list the checks and exit")
    sel.add_argument(
        "--only", action="append", metavar="ID|CATEGORY", help="run only these (comma list, repeatable)"
    )
    sel.add_argument(
        "--skip", action="append", metavar="ID|CATEGORY", help="skip these (comma list, repeatable)"
    )
    sel.add_argument("--quick", action="store_true", help="leave out the workload checks (GPU jobs)")


def _verdict_options(p: argparse.ArgumentParser) -> None:
    """Verdict: when the node is not ready."""
    ver = p.add_argument_group("verdict")
    ver.add_argument(
        "--fail-level",
        choices=tuple(FAIL_LEVELS),
        help="not ready when any check is at this level or worse (errors count as fail; default: fail)",
    )
    ver.add_argument(
        "--min-score", type=int, metavar="N", help="not ready when the score is below N (default 0)"
    )


def _environment_options(p: argparse.ArgumentParser) -> None:
    """Environment: where the node's facts, files and Pythons are."""
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
        type=host_root,
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


def _workload_options(p: argparse.ArgumentParser) -> None:
    """Workload: the GPU jobs."""
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


def run(args: argparse.Namespace) -> int:
    """``hostcheck check``: select, gather, judge, report. Usage errors raise argparse.ArgumentError."""
    started = time.monotonic()
    request = build_request(args, load, started)
    if request.listing:
        return _list(request)
    return check(request, started)


def _list(request: Request) -> int:
    """--list: the selected checks, as text or (with --json) as a JSON document."""
    if request.output.json:
        rows = [
            {"id": c.id, "title": c.title, "category": c.category, "weight": c.weight, "workload": c.workload}
            for c in request.checks
        ]
        sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, "checks": rows}, indent=2) + "\n")
    else:
        from hostcheck.check.render.text import render_list

        sys.stdout.write(render_list(list(request.checks)))
    return EXIT_OK


def check(request: Request, started: float) -> int:
    """Gather what the selected checks need, judge it, report it, and tell Slurm when asked to."""
    options = request.options
    assert options is not None and options.deadline is not None  # build_request sets both unless --list
    checks = list(request.checks)
    needs = set().union(*(c.needs for c in checks)) & set(gather.GATHERERS)
    when = now_iso()
    out = request.output
    line = progress(
        "hostcheck",
        sys.stderr,
        out.json or out.summary,
        request.slurm_drain,
        limit_s=options.deadline - started,
    )
    with _Watchdog(options.deadline, request.profile.name):
        with line:  # erased before the report is printed
            snapshot = gather.gather(replace(options, progress=line), needs)
            # Children of gatherers the deadline cut off die now, not at their own limits; nothing new starts.
            overran = time.monotonic() >= options.deadline
            if overran:
                kill_all()
            line.begin(f"judging {len(checks)} checks")
            results, v = evaluate(
                snapshot, checks, request.fail_level, request.min_score, request.timeout_s, options.deadline
            )
        report = build_report(snapshot, results, v, started, when, request.profile.name)
        code = emit(report, request.output)
        if request.slurm_drain:
            if overran:
                reopen()  # scontrol must still run: the verdict stands and Slurm must hear it
            # Imported only where Slurm asked: the passive health check runs every few minutes.
            from hostcheck.slurm import apply

            action = apply(report, options.config.slurm)
            if overran:
                kill_all()
            print(f"hostcheck: slurm: {action.message}", file=sys.stderr)
            if action.kind == "error":
                return EXIT_USAGE
    return code


class _Watchdog:
    """The last line of defence: a run still going well past its deadline (a check stuck where no timeout
    reaches) ends with exit 2 and every child killed, instead of holding the health check's slot."""

    GRACE_S = 15.0

    def __init__(self, deadline: float, profile: str) -> None:
        self.deadline, self.profile = deadline, profile
        self.timer: Timer | None = None

    def __enter__(self) -> _Watchdog:
        wait = max(0.0, self.deadline - time.monotonic()) + self.GRACE_S
        self.timer = Timer(wait, self.fire)
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


def emit(report: Report, output: Output) -> int:
    """Write the report files and print the report; its exit code, or 2 when a report did not reach its reader.
    Each renderer is imported only when its form is asked for (the passive profile runs every few minutes)."""
    try:
        if output.prometheus:
            from hostcheck.check.render.prometheus import read_last_success, render_prometheus

            # The textfile is rewritten every run: a not-ready run keeps the last ready run's time.
            last = None if report.verdict.ready else read_last_success(output.prometheus)
            write_report(output.prometheus, render_prometheus(report, last))
        if output.junit:
            from hostcheck.check.render.junit import render_junit

            write_report(output.junit, render_junit(report))
    except OSError as exc:
        print(f"hostcheck: error: writing a report file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if output.summary:
            from hostcheck.check.render.summary import render_summary

            sys.stdout.write(render_summary(report))
        elif output.json:
            from hostcheck.check.render.json import render_json

            sys.stdout.write(render_json(report))
        else:
            from hostcheck.check.render.text import render_text, terminal_width

            colour = output.color == "always" or (
                output.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
            )
            width = terminal_width(sys.stdout)
            sys.stdout.write(render_text(report, colour=colour, verbose=output.verbose, width=width))
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
