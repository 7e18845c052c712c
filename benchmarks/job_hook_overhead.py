#!/usr/bin/env python3
"""What does ``hostcheck job``'s hook cost a training step?

A CPU training loop (a DataLoader over tensors in memory, num_workers=0, an MLP, SGD) runs in a fresh Python
three ways, in interleaved rounds (each round runs the three in a shuffled order):

- ``plain``: as the user would run it;
- ``hook``: with the hook loaded the way ``hostcheck job`` loads it (its sitecustomize folder first on PYTHONPATH,
  a run folder in HOSTCHECK_JOB_DIR): every next() and optimizer step goes through it;
- ``job``: under ``hostcheck job`` itself (the hook plus the /proc and NVML sampling beside it).

Each run times ``--steps`` steps after a warm-up and reports its median step. Per round the ratio hook/plain and
job/plain is taken; the overhead is the median of those paired ratios (and the median of the paired differences
in microseconds a step). Between processes the noise of a shared machine is larger than the hook's cost, so one
more measurement pairs within one process (``in-process``): blocks of ``--block`` steps alternate with the hook's
patches applied and removed, and the overhead is the median of the paired block medians. Two loop sizes:
``small`` (about a millisecond and a half a step here) and ``tiny`` (a fraction of a millisecond: the worst case,
where a fixed cost per step weighs most).

    python3 benchmarks/job_hook_overhead.py [--rounds 5] [--steps 400] [--blocks 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from machine import describe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBSITE = os.path.join(ROOT, "hostcheck", "inside", "jobsite")

LOOP = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
size, steps, warm = sys.argv[1], int(sys.argv[2]), 50
torch.manual_seed(0)
torch.set_num_threads(1)
dims = {"small": (256, 1024, 64), "tiny": (32, 32, 8)}[size]
d, h, b = dims
n = (steps + warm) * b
data = TensorDataset(torch.randn(n, d), torch.randn(n, 1))
model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
times = []
t_prev = time.perf_counter()
for i, (x, y) in enumerate(DataLoader(data, batch_size=b)):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    now = time.perf_counter()
    if i >= warm:
        times.append(now - t_prev)
    t_prev = now
print("BENCH " + json.dumps({"median_s": sorted(times)[len(times) // 2], "steps": len(times)}))
"""


INPROCESS = r"""
import importlib.util, json, sys, tempfile, time
import torch
from torch.utils.data import DataLoader, TensorDataset
size, blocks, block, hook_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spec = importlib.util.spec_from_file_location("hostcheck_job_hook", hook_path)
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)
run_dir = tempfile.mkdtemp(prefix="hostcheck-bench-")
torch.manual_seed(0)
torch.set_num_threads(1)
d, h, b = {"small": (256, 1024, 64), "tiny": (32, 32, 8)}[size]
data = TensorDataset(torch.randn(block * b, d), torch.randn(block * b, 1))
model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
loader = DataLoader(data, batch_size=b)


def run_block():
    times = []
    t_prev = time.perf_counter()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - t_prev)
        t_prev = now
    return sorted(times[1:])[len(times) // 2]


hook.install(run_dir)
hook.uninstall()
run_block()  # warm-up
pairs = []
for i in range(blocks):
    on_first = i % 2 == 0
    got = {}
    for on in (on_first, not on_first):
        if on:
            hook._done_torch.add("torch")
            hook._on_import("torch")
        got[on] = run_block()
        if on:
            hook.uninstall()
    pairs.append((got[False], got[True]))
hook.flush(final=True)
print("BENCH " + json.dumps({"pairs": pairs}))
"""


def in_process(size: str, blocks: int, block: int, script: str) -> list[tuple[float, float]]:
    hook_path = os.path.join(ROOT, "hostcheck", "inside", "job_hook.py")
    p = subprocess.run(
        [sys.executable, script, size, str(blocks), str(block), hook_path],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"in-process/{size} failed ({p.returncode}): {p.stderr[-2000:]}")
    return [tuple(x) for x in json.loads(line[len("BENCH ") :])["pairs"]]


def machine() -> str:
    return f"{describe()}, torch {_torch_version()}"


def _torch_version() -> str:
    p = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return p.stdout.strip() or "?"


def once(variant: str, size: str, steps: int, script: str) -> float:
    env = {**os.environ, "PYTHONPATH": ROOT}
    argv = [sys.executable, script, size, str(steps)]
    with tempfile.TemporaryDirectory(prefix="hostcheck-bench-") as run_dir:
        if variant == "hook":
            env["PYTHONPATH"] = JOBSITE + os.pathsep + ROOT
            env["HOSTCHECK_JOB_DIR"] = run_dir
        elif variant == "job":
            argv = [sys.executable, "-m", "hostcheck", "job", "-q", "--", *argv]
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        if variant == "hook" and not os.listdir(run_dir):
            raise SystemExit("the hook wrote no records: it was not loaded")
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"{variant}/{size} failed ({p.returncode}): {p.stderr[-2000:]}")
    return float(json.loads(line[len("BENCH ") :])["median_s"])


def summarise(pairs: list[tuple[float, float]]) -> dict:
    ratios = sorted(b / a for a, b in pairs)
    diffs = sorted((b - a) * 1e6 for a, b in pairs)
    return {
        "overhead_pct": round((statistics.median(ratios) - 1) * 100, 2),
        "ratio_min": round(ratios[0], 4),
        "ratio_max": round(ratios[-1], 4),
        "diff_us_median": round(statistics.median(diffs), 2),
        "plain_step_ms_median": round(statistics.median(a for a, _ in pairs) * 1000, 3),
        "rounds": len(pairs),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--blocks", type=int, default=40, help="in-process: pairs of blocks")
    ap.add_argument("--block", type=int, default=100, help="in-process: steps a block")
    ap.add_argument("--sizes", default="small,tiny")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    results: dict = {"machine": machine(), "steps": a.steps}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(LOOP)
        script = f.name
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(INPROCESS)
        inproc = f.name
    try:
        for size in a.sizes.split(","):
            runs: dict[str, list[float]] = {"plain": [], "hook": [], "job": []}
            for _ in range(a.rounds):
                order = list(runs)
                random.shuffle(order)
                for variant in order:
                    runs[variant].append(once(variant, size, a.steps, script))
            results[size] = {v: summarise(list(zip(runs["plain"], runs[v]))) for v in ("hook", "job")}
            results[size]["in-process"] = summarise(in_process(size, a.blocks, a.block, inproc))
            print(f"{size}: plain median step {results[size]['hook']['plain_step_ms_median']} ms", flush=True)
            for v in ("in-process", "hook", "job"):
                s = results[size][v]
                print(
                    f"  {v:10s} {s['overhead_pct']:+.2f}% (paired ratios {s['ratio_min']:.3f}-{s['ratio_max']:.3f}), "
                    f"{s['diff_us_median']:+.1f} us a step, {s['rounds']} rounds",
                    flush=True,
                )
    finally:
        os.unlink(script)
        os.unlink(inproc)
    print(results["machine"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
