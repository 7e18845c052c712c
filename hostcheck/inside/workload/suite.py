"""The suite: the sections in one process (one ``import torch``), a record per section; the command line."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from .amp import probe_amp
from .burn import probe_burn
from .common import emit
from .compute import probe_matmul
from .dataloader import probe_dataloader
from .ddp import ddp_worker, probe_ddp_inprocess
from .env import probe_env
from .memory import probe_bandwidth
from .p2p import probe_p2p

# --------------------------------------------------------------------------------------------- suite

SECTIONS = {
    "env": probe_env,
    "matmul": probe_matmul,
    "bandwidth": probe_bandwidth,
    "amp": probe_amp,
    "dataloader": probe_dataloader,
    "ddp": probe_ddp_inprocess,
    "p2p": probe_p2p,
}
DEFAULT_SECTIONS = ("env", "matmul", "bandwidth", "amp", "dataloader")


def run_suite(args: dict) -> None:
    """Run the sections in one process (one `import torch`); a record per section, errors kept."""
    sections = args.get("sections") or DEFAULT_SECTIONS
    per = args.get("args") or {}
    for name in sections:
        emit({"probe": name, "event": "start", "t": time.time()})
        sub = dict(per.get(name) or {})
        for k in ("device", "gpus"):
            if k in args and k not in sub:
                sub[k] = args[k]
        emit(run_probe(name, SECTIONS[name], sub))


def run_probe(name: str, fn, args: dict) -> dict:
    """The result record of one probe: its data, or the exception and traceback it raised."""
    t0 = time.perf_counter()
    try:
        return {"probe": name, "ok": True, "data": fn(args), "wall_s": round(time.perf_counter() - t0, 3)}
    except Exception as exc:
        return {
            "probe": name,
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-2000:],
            "wall_s": round(time.perf_counter() - t0, 3),
        }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write(
            "usage: python -m hostcheck.inside.workload suite|ddp_worker|burn|<section> [--json-args JSON]\n"
        )
        return 2
    name = argv[0]
    args: dict = {}
    if "--json-args" in argv:
        args = json.loads(argv[argv.index("--json-args") + 1])
    if name == "suite":
        run_suite(args)
        return 0
    fns = dict(SECTIONS, ddp_worker=ddp_worker, burn=probe_burn)
    if name not in fns:
        sys.stderr.write(f"unknown probe {name!r}\n")
        return 2
    # Under torchrun a rank's traceback is lost among the agents' output: the record carries it.
    rec = run_probe(name, fns[name], args)
    emit(rec)
    if not rec["ok"]:
        sys.stderr.write(rec["traceback"])
        return 1
    if name == "ddp_worker":
        # Seen once under load in a container: gloo's threads aborted the interpreter's teardown ("terminate
        # called without an active exception", SIGABRT) after the result was out. The measurement is complete
        # and emitted, so leave without the teardown rather than turn a finished check into a crash.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
