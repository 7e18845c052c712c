"""One ``hostcheck check`` run as a frozen request: the command line and the configuration file merged once,
validated once. What is wrong is a usage error (argparse.ArgumentError); what the request holds is never
checked again: the gatherers get its :class:`hostcheck.gather.Options` as they are.
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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from hostcheck import config, gather
from hostcheck.outfile import paths_error
from hostcheck.profiles import (
    DEFAULT_PROFILE,
    DEFAULT_SECTIONS,
    PROFILES,
    Profile,
    merge_section_args,
    workload_args,
)
from hostcheck.registry import Check, select


@dataclass(frozen=True)
class Output:
    """Where the report goes and in which form."""

    json: bool = False
    summary: bool = False
    color: str = "auto"
    verbose: bool = False
    #: node_exporter textfile and JUnit XML, written besides standard output.
    prometheus: str | None = None
    junit: str | None = None


@dataclass(frozen=True)
class Request:
    """A validated ``hostcheck check``: which checks, judged how, reported where, gathered with what."""

    profile: Profile
    checks: tuple[Check, ...]
    output: Output
    #: --list: print the selected checks; nothing is gathered and the rest of the request is not validated.
    listing: bool = False
    fail_level: str = "fail"
    min_score: int = 0
    #: Per-check timeout, seconds.
    timeout_s: float = 30.0
    slurm_drain: bool = False
    #: What the gatherers read (the deadline and the configuration file's settings included); None for --list.
    options: gather.Options | None = None


def split(values: list[str] | None) -> list[str]:
    """Comma lists given once or repeated (--only a,b --only c) -> their items."""
    return [x.strip() for v in values or [] for x in v.split(",") if x.strip()]


if TYPE_CHECKING:  # only in annotations: "X | None" evaluated at import fails on Python 3.9
    #: The checks that a set of gatherers can judge, at least (every check for None): hostcheck.checks.load.
    Catalogue = Callable[[frozenset[str] | None], list[Check]]


def build_request(args: argparse.Namespace, catalogue: Catalogue, started: float | None = None) -> Request:
    """The command line's options over the configuration file's over the built-in defaults, checked once.

    ``catalogue`` gives the checks (hostcheck.checks.load); ``started`` (time.monotonic()) is when the run's
    deadline starts."""
    started = time.monotonic() if started is None else started
    try:
        cfg = config.from_args(args)
    except config.ConfigError as exc:
        raise ArgumentError(None, f"{exc} (see --config and docs/operations.md)") from None
    profile = PROFILES[args.profile or cfg.profile or DEFAULT_PROFILE]
    only = split(args.only or list(cfg.only))
    checks = _select(catalogue, profile, only, split(list(cfg.skip) + (args.skip or [])), args.quick)
    output = Output(
        json=args.json,
        summary=args.summary,
        color=args.color,
        verbose=args.verbose,
        prometheus=cfg.prometheus if args.prometheus is None else args.prometheus,
        junit=args.junit,
    )
    request = Request(profile=profile, checks=tuple(checks), output=output, listing=args.list)
    if args.list:
        return request
    if not checks:
        raise ArgumentError(None, "no checks selected")
    expect_gpus = cfg.expect_gpus if args.expect_gpus is None else args.expect_gpus
    if expect_gpus is not None and expect_gpus < 0:
        raise ArgumentError(None, "--expect-gpus must be >= 0")
    min_score = args.min_score if args.min_score is not None else cfg.min_score or 0
    if not 0 <= min_score <= 100:
        raise ArgumentError(None, "--min-score must be 0-100")
    burn = profile.burn_s if args.burn is None else args.burn
    _workload_needs_a_profile_that_runs_it(args, profile)
    sections, section_args = _validate_workload(args, burn)
    _validate_environment(output)
    options = gather.Options(
        deadline=started + (args.deadline or profile.deadline_s),
        config=cfg,
        expect_gpus=expect_gpus,
        python=args.python,
        facts_dir=args.facts_dir,
        env_file=args.env_file,
        torch_timeout_s=args.torch_timeout,
        burn=burn,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        nproc_per_node=args.nproc_per_node,
        workload_timeout_s=args.workload_timeout,
        rdzv_timeout_s=args.rdzv_timeout,
        workload_device=args.workload_device,
        workload_sections=sections,
        # The sizes follow the profile's time budget; what the command line names wins.
        workload_section_args=merge_section_args(workload_args(profile), section_args),
        data_dirs=tuple(args.data_dir or ()),
        data_rate_mb_s=args.data_rate,
        host_root=args.host_root,
        state_file=args.state_file,
        dcgm_level=profile.dcgm_level,
    )
    if options.state_path and {"hardware", "rdma"} & {n for c in checks for n in c.needs}:
        clash = _state_file_error(options.state_path, output)
        if clash:
            raise ArgumentError(None, clash)
    return replace(
        request,
        fail_level=args.fail_level or cfg.fail_level or "fail",
        min_score=min_score,
        timeout_s=args.timeout,
        slurm_drain=cfg.slurm.drain if args.slurm_drain is None else args.slurm_drain,
        options=options,
    )


def _select(
    catalogue: Catalogue, profile: Profile, only: list[str], skip: list[str], quick: bool
) -> list[Check]:
    """--only, --skip and --quick, then the profile. Only the check modules the profile can run are loaded (the
    passive profile starts every few minutes on every node); a selection that names a check outside them or keeps
    none of them is answered from every check, so that its answer (or its error) is the one every check gives:
    the checks a profile runs are all among the first."""
    with contextlib.suppress(ArgumentError):
        chosen = _select_from(catalogue(profile.needs), profile, only, skip, quick)
        if chosen:
            return chosen
    return _select_from(catalogue(None), profile, only, skip, quick)


def _select_from(
    catalogue: list[Check], profile: Profile, only: list[str], skip: list[str], quick: bool
) -> list[Check]:
    """--only, --skip and --quick over ``catalogue``, then the profile: a check named with --only that the profile
    leaves out is refused."""
    try:
        checks = select(catalogue, only, skip, quick)
    except ValueError as exc:
        raise ArgumentError(None, str(exc)) from None
    named = {x.lower() for x in only}
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
    return allowed


def _workload_needs_a_profile_that_runs_it(args: argparse.Namespace, profile: Profile) -> None:
    """An option of the GPU workload under a profile that runs none (the default's included) is refused: the long
    run is asked for by name (--profile full), never started by an option's side effect nor dropped in silence."""
    if "workload" in profile.needs:
        return
    given = [
        flag
        for flag, value in (
            ("--burn", args.burn),
            ("--nnodes", args.nnodes),
            ("--workload-sections", args.workload_sections),
            ("--workload-section-args", args.workload_section_args),
        )
        if value
    ]
    if given:
        raise ArgumentError(
            None,
            f"{given[0]} sets up the GPU workload, which the {profile.name} profile does not run: "
            "add --profile full",
        )


def _validate_workload(
    args: argparse.Namespace, burn: float
) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """The workload options and the training Python; returns the sections to run and their arguments."""
    if bool(args.nnodes) != bool(args.rdzv_endpoint):
        raise ArgumentError(None, "--nnodes and --rdzv-endpoint go together")
    if args.nnodes and not re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", args.nnodes):
        raise ArgumentError(None, "--nnodes takes N or MIN:MAX, e.g. 3 or 2:4")
    if args.rdzv_endpoint and not re.fullmatch(r"[^\s:]+:[0-9]{1,5}", args.rdzv_endpoint):
        raise ArgumentError(None, "--rdzv-endpoint takes HOST:PORT")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise ArgumentError(None, "--nproc-per-node must be >= 1")
    sections = tuple(split([args.workload_sections])) if args.workload_sections else DEFAULT_SECTIONS
    unknown = sorted(set(sections) - set(DEFAULT_SECTIONS))
    if unknown:
        raise ArgumentError(None, f"--workload-sections: unknown section(s) {', '.join(unknown)}")
    section_args = _section_args(args.workload_section_args)
    if args.quick and (burn or args.nnodes):
        raise ArgumentError(None, "--quick leaves the workload out: it cannot go with --burn or --nnodes")
    if args.python and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ArgumentError(None, f"--python {args.python}: not an executable file")
    return sections, section_args


def _validate_environment(output: Output) -> None:
    """Standard output, the temporary folder and the report files: usable before anything runs."""
    if sys.stdout is None:
        raise ArgumentError(None, "standard output is closed: nowhere to print the report")
    tmp_error = _temp_dir_error()
    if tmp_error:
        raise ArgumentError(None, tmp_error)
    bad_path = paths_error([("--prometheus", output.prometheus), ("--junit", output.junit)])
    if bad_path:
        raise ArgumentError(None, bad_path)


def _state_file_error(path: str, output: Output) -> str | None:
    """Why the state file cannot be ``path``: a report's path, or the standard output the report goes to (the
    counters and the report would replace or corrupt each other)."""
    key = os.path.realpath(path)
    for flag, other in (("--prometheus", output.prometheus), ("--junit", output.junit)):
        if other and os.path.realpath(other) == key:
            return f"--state-file {path} and {flag} name the same file: give the counters a file of their own"
    try:
        st, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        return None
    if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
        what = "the --json document" if output.json else "the report"
        return f"--state-file {path} is the standard output, where {what} goes: give the counters a file of their own"
    return None


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
