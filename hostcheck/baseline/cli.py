"""``hostcheck baseline``: what this known-good node has, as the [baseline] section of the configuration file. The
command line around it (exit 2 on usage errors, signals, --debug) is hostcheck.command.

Exit codes: 0 recorded (printed or written), 1 nothing could be recorded, 2 usage or environment error (a --write
path that cannot take the file, a configuration file that is not valid). Docs: docs/baseline.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from argparse import ArgumentError

# The gatherers are called through their module (gather.gather), as check calls them.
from hostcheck import config, gather, infile
from hostcheck.argtypes import host_root
from hostcheck.baseline.record import section
from hostcheck.baseline.render import render_json, render_toml
from hostcheck.baseline.toml import SECTION, TomlError, loads, splice
from hostcheck.exitcodes import EXIT_NOTHING_RECORDED, EXIT_OK, EXIT_USAGE
from hostcheck.outfile import locked, path_error, write_atomic
from hostcheck.report import now_iso

SUMMARY = "record what this known-good node has as the [baseline] section of the config (docs/baseline.md)"
DESCRIPTION = (
    "Record what this known-good node has (CPU model and counts, memory size, NVMe drives, network and RDMA ports "
    "with their rates, GPUs with their VBIOS, PCIe links of the GPUs and NICs, NUMA layout) as the [baseline] "
    "section of hostcheck's configuration. The baseline checks (baseline.E001-E007) then compare every node of "
    "the same type with it. Prints the section (TOML) by default."
)
EPILOG = (
    "Exit codes: 0 recorded, 1 nothing could be recorded, 2 usage or environment error. "
    f"--write {config.DEFAULT_PATH} replaces only its [baseline] section. Docs: docs/baseline.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--write",
        metavar="PATH",
        help="put the section into this configuration file (replacing its [baseline] section, the rest kept "
        "byte for byte; created when absent), atomically, instead of printing it",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the section as JSON (for the inventory: gpunode_health_baseline takes it as it is)",
    )
    p.add_argument(
        "--host-root",
        default="/",
        type=host_root,
        metavar="DIR",
        help="where the node's /sys and /proc are read (default /; a fixture tree in tests)",
    )


def run(args: argparse.Namespace) -> int:
    if args.write is not None and args.json:
        raise ArgumentError(None, "--json prints the section: it cannot go with --write")
    if args.write is None and sys.stdout is None:
        raise ArgumentError(None, "standard output is closed: nowhere to print the section (see --write)")
    if args.write is not None:
        _existing(args.write)  # a path or file that cannot take the section: said before anything is gathered
    # Read only: NVML for the GPUs, the rest under --host-root (the same gatherer as the checks').
    snap = gather.gather(gather.Options(host_root=args.host_root), {"nvml", "inventory"})
    inv = snap.inventory
    if inv is None:
        print("hostcheck baseline: error: the node's inventory could not be gathered", file=sys.stderr)
        return EXIT_NOTHING_RECORDED
    host = socket.gethostname()
    body, left_out = section(inv, host, now_iso())
    for line in left_out:
        print(f"hostcheck baseline: {line}", file=sys.stderr)
    if not set(body) - {"recorded_on", "recorded_at"}:
        print("hostcheck baseline: error: nothing could be recorded", file=sys.stderr)
        return EXIT_NOTHING_RECORDED
    text = render_toml(body, host)
    # What is printed or written is what hostcheck reads back: the same entry and size limits (never a section
    # the checks would refuse).
    _readable(text, args.write or "the section")
    if args.json:
        sys.stdout.write(render_json(body))
        return EXIT_OK
    if args.write is None:
        sys.stdout.write(text)
        return EXIT_OK
    return _write(args.write, text)


def _existing(path: str) -> str:
    """The configuration file's text ('' when absent), refused as a usage error before anything is gathered."""
    why = path_error(path)
    if why:
        raise ArgumentError(None, f"--write {path or repr(path)}: {why}")
    if not os.path.lexists(path):
        return ""
    try:
        text = infile.read_text(path, follow=False)
    except infile.ReadError as exc:
        raise ArgumentError(None, f"--write {exc} (a configuration file is a regular file)") from None
    try:
        config.parse(loads(text), path)
    except (config.ConfigError, TomlError) as exc:
        raise ArgumentError(None, f"--write: {exc}: fix the file first") from None
    return text


def _readable(text: str, path: str) -> None:
    """Refuse (a usage error) a configuration hostcheck would not read back: larger than the config reader's cap,
    or what its parser refuses (more than BASELINE_MAX_ITEMS entries in a list, a value out of range)."""
    size = len(text.encode("utf-8"))
    if size > infile.DEFAULT_LIMIT:
        raise ArgumentError(
            None,
            f"{path} would be {size} bytes, more than the {infile.DEFAULT_LIMIT} hostcheck reads: not written",
        )
    try:
        config.parse(loads(text), path)
    except (TomlError, config.ConfigError) as exc:
        raise ArgumentError(None, f"{path}: {exc}: not written") from None


def _write(path: str, text: str) -> int:
    """Put the section into ``path``: the folder locked, the file read again (an edit made meanwhile is kept), the
    result checked as the reader will check it, then replaced in one rename keeping its owner and mode."""
    try:
        with locked(path):
            existing = _existing(path)
            result = splice(existing, text) if existing else text
            _readable(result, f"--write {path}")
            write_atomic(path, result, keep=True)
    except TomlError as exc:
        raise ArgumentError(None, f"--write {path}: {exc}") from None
    except OSError as exc:
        print(f"hostcheck baseline: error: writing {path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"hostcheck baseline: [{SECTION}] written to {path}", file=sys.stderr)
    return EXIT_OK
