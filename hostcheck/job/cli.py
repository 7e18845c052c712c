"""``hostcheck job [--seconds N] -- COMMAND ...``: run the user's training command, watch it, and say what holds
its GPUs back (docs/job.md).

The command runs unchanged with hostcheck's standard streams; the report goes to standard error when it has
finished (``--json PATH`` and ``--png PATH`` for the files). The exit code is the command's own: ``hostcheck job --
sh -c 'exit 3'`` exits 3, a command killed by signal N exits 128 + N, one stopped at the end of ``--seconds``
exits 0, one that cannot start 127 (not found) or 126. hostcheck's own usage errors exit 2 before anything
starts, which a command can exit with too: the JSON report's ``job.rc`` tells them apart.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from argparse import ArgumentError
from typing import Any

from hostcheck import config
from hostcheck.argtypes import seconds
from hostcheck.child.launch import remove_at_death, removed
from hostcheck.gather.datapath import describe_dir, read_mounts
from hostcheck.job.analyse import Analysis, analyse
from hostcheck.job.diagnosis import Diagnosis, diagnose
from hostcheck.job.observe import Observation, observe
from hostcheck.job.png import draw_timeline
from hostcheck.job.records import HookProcess, read_run
from hostcheck.job.render import render_json, render_text
from hostcheck.outfile import paths_error, write_report
from hostcheck.progress import duration, wanted

#: The shortest sampling interval. CPU times in /proc/PID/stat are counted in clock ticks (proc(5): divide by
#: sysconf(_SC_CLK_TCK), 100 on Linux): at 0.1 s a process's CPU share moves in steps of 10%; below it the
#: samples are mostly rounding.
MIN_INTERVAL_S = 0.1

SUMMARY = "run a training command and say what holds its GPUs back (input, compute, communication)"
DESCRIPTION = (
    "Run your training command (python, torchrun, a launcher) unchanged, watch it for a window or to its end "
    "(DataLoader waits and settings from a hook in every Python it starts; CPU, reads and /dev/shm from /proc; "
    "GPUs through NVML) and print a verdict with its evidence and the fix."
)
EPILOG = (
    "Exit code: the command's own (128+N when signal N killed it, 0 when --seconds stopped it, 127/126 when it "
    "could not start); 2 for hostcheck's usage errors, before the command starts; 129/130/143 when hostcheck itself "
    "gets SIGHUP/SIGINT/SIGTERM (passed on to the command, SIGKILL after --grace). Docs: docs/job.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seconds",
        type=seconds,
        metavar="N",
        help="stop the command after N seconds (SIGINT to its group, then SIGKILL after --grace); default: "
        "run it to its end",
    )
    p.add_argument("--json", metavar="PATH", help="also write the JSON report to PATH")
    p.add_argument("--png", metavar="PATH", help="also write the timeline picture (PNG) to PATH")
    p.add_argument("-q", "--quiet", action="store_true", help="no text report on standard error")
    p.add_argument(
        "--data-dir",
        action="append",
        metavar="DIR",
        default=None,
        help="a dataset directory whose disk to watch (repeatable; datasets with a .root are found by themselves)",
    )
    p.add_argument(
        "--interval", type=seconds, default=0.5, metavar="S", help="sampling interval (default 0.5: 2 Hz)"
    )
    p.add_argument(
        "--grace",
        type=seconds,
        default=5.0,
        metavar="S",
        help="seconds between SIGINT and SIGKILL when the window ends or hostcheck is interrupted (default 5)",
    )
    p.add_argument(
        "--keep-records",
        metavar="DIR",
        help="write the hook's raw records into DIR (an existing empty folder) and keep them",
    )
    config.add_option(p)
    p.add_argument(
        "job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run"
    )


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.job_command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ArgumentError(None, "give the command to run after --, e.g. hostcheck job -- python train.py")
    return cmd


def run(args: argparse.Namespace) -> int:
    cmd = _command(args)
    bad = paths_error([("--json", args.json), ("--png", args.png)])
    if bad:
        raise ArgumentError(None, bad)
    if not MIN_INTERVAL_S <= args.interval <= 60:
        raise ArgumentError(None, f"--interval: from {MIN_INTERVAL_S:g} to 60 seconds")
    try:  # [thresholds] of --config, else of the file `hostcheck check` reads: read before the command starts
        lines = config.from_args(args).job_thresholds
    except config.ConfigError as exc:
        raise ArgumentError(None, str(exc)) from None
    keep = args.keep_records
    if keep is not None:
        if not os.path.isdir(keep) or os.listdir(keep):
            raise ArgumentError(None, f"--keep-records {keep}: not an existing empty folder")
        run_dir = os.path.abspath(keep)
    else:
        try:
            run_dir = tempfile.mkdtemp(prefix="hostcheck-job-")
        except OSError as exc:
            raise ArgumentError(None, f"cannot create a temporary folder: {exc.strerror or exc}") from None
    # mkdtemp's folder is already private (0700); a --keep-records folder is the user's, its mode theirs.
    dropped: list[str] = []
    if keep is None:  # SIGKILL cannot be caught: the reaper removes the folder then
        remove_at_death(run_dir)
    if not args.quiet and wanted(
        sys.stderr
    ):  # the command's own output is its progress: say only when it ends
        _say(_watching(args))
    try:
        # SIGHUP/SIGINT/SIGTERM are forwarded to the command inside; a second one while it ends leaves with no report.
        obs = observe(cmd, run_dir, seconds=args.seconds, interval=args.interval, grace=args.grace)
        hooks = read_run(run_dir, dropped)
    finally:
        if keep is None:
            shutil.rmtree(run_dir, ignore_errors=True)
            removed(run_dir)
    try:
        _report(args, obs, hooks, dropped, lines)
    except (
        Exception
    ) as exc:  # records the job wrote are its own: whatever they hold, its exit code comes back
        _say(f"hostcheck job: error: no report: {type(exc).__name__}: {exc}")
    return obs.exit_code


def _watching(args: argparse.Namespace) -> str:
    if args.seconds:
        return (
            f"hostcheck job: watching the command for {duration(args.seconds)} (--seconds), then SIGINT and up "
            f"to {args.grace:g} s for it to stop; the report follows"
        )
    return "hostcheck job: watching the command to its end (Ctrl-C stops it); the report follows"


def _report(
    args: argparse.Namespace,
    obs: Observation,
    hooks: list[HookProcess],
    dropped: list[str],
    lines: Any = None,
) -> None:
    dirs = list(args.data_dir or [])
    for h in hooks:
        for it in h.iterators:
            root = it.get("dataset_root")
            if isinstance(root, str) and root not in dirs:
                dirs.append(root)
    mounts = read_mounts()
    data_dirs = [describe_dir(d, mounts) for d in dirs]
    a = analyse(obs, hooks, data_dirs, dropped)
    v = diagnose(a) if lines is None else diagnose(a, lines)
    _write(args, a, v)


def _write(args: argparse.Namespace, a: Analysis, v: Diagnosis) -> None:
    """The report files and the text; a failure is said on stderr and leaves the job's exit code alone."""
    if args.png:
        gpu_note = a.gpu_error or ("" if a.gpus else "no GPU")
        subtitle = f"{' '.join(a.command)[:90]} | {a.duration_s:.0f} s | exit {a.exit_code}"
        try:
            data = draw_timeline(
                a.timeline, f"hostcheck job: {v.kind}", subtitle + " | " + v.headline, gpu_note
            )
            write_report(args.png, data)
        except OSError as exc:
            _say(f"hostcheck job: error: writing {args.png}: {exc.strerror or exc}")
    if args.json:
        try:
            write_report(args.json, render_json(a, v, args.png))
        except OSError as exc:
            _say(f"hostcheck job: error: writing {args.json}: {exc.strerror or exc}")
    if not args.quiet:
        _say(render_text(a, v, args.seconds))


def _say(text: str) -> None:
    # Standard error closed (None), full or gone: the report is lost, never the job's exit code.
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
