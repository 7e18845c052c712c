"""Measurements in the *training* Python, one-shot or served by a long-lived process.

``python -m hostcheck.inside.bench_worker '<json config>'`` runs one task and exits. Records are lines
``HOSTCHECK_WORKLOAD_JSON:{...}`` (hostcheck.child.launch parses them): ``{"event": "start"}`` right
before the measured part, so a crash after it is the workload's and not the setup's, then one result,
``{"ok": true, "metric": ..., ...}`` or ``{"ok": false, "error": ..., "stage": ...}``. Config "task":
``probe`` (environment only), ``images`` (write the JPEGs once), ``measure`` (default: one workload,
``pipeline``, ``train`` or ``e2e``, under the environment the orchestrator set).

``python -m hostcheck.inside.bench_worker --serve '<json: {"expect": {...}}>'`` serves one variant of a group
(hostcheck.child.session is the other end): it checks the cheap proofs, imports torch and PIL once and prints
a hello line, then reads one ``measure`` config per line on stdin and answers each with exactly one JSON
line (``"started"`` says whether the measured part was reached), until EOF. Answers are plain JSON lines
on the original stdout; everything else that prints to stdout in this process (torch, DataLoader workers,
libraries) is sent to stderr, so it cannot corrupt an answer.

Standard library, torch and PIL only (torch imported after the cheap checks), Python >= 3.9. The data and
model are the workload probes' (hostcheck.inside.fixtures: JPEG writer, dataset, conv-net); what it reports
of its environment (mapped libraries, allocator, PIL, threads) is read by the environment probe's functions
(hostcheck.inside.probe).
"""

from __future__ import annotations

import gc
import glob
import json
import math
import os
import platform
import sys
import time
import traceback

from hostcheck.inside import probe, proof
from hostcheck.inside.fixtures import JpegDataset, shm_bytes, small_cnn, write_jpegs
from hostcheck.inside.probe import cpus, pil_info, threads_info
from hostcheck.inside.workload.common import emit

ENV_KEYS = ("LD_PRELOAD", "MALLOC_CONF", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


#: Set while serving (serve()): whether the current request reached its measured part (mark_start).
_serving: dict | None = None


def mark_start() -> None:
    """The measured part begins: a crash from here on is the workload's, not the setup's."""
    if _serving is not None:
        _serving["started"] = True
    else:
        emit({"event": "start"})


def shm_free_bytes(path: str = "/dev/shm") -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_frsize * st.f_bfree


def allocator_info(maps: list[str] | None = None) -> dict:
    """The environment probe's allocator_info, with the allocator kinds the proofs use."""
    return probe.allocator_info(proof.allocator_kind, maps)


def _device(torch, want: str):
    if want == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", 0)


def _sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ------------------------------------------------------------------------------------------- workloads


def _dataset(cfg: dict, crop: int):
    want = int(cfg["images"])
    paths = sorted(glob.glob(os.path.join(cfg["images_dir"], "img_*.jpg")))[:want]
    if len(paths) < want:
        raise RuntimeError(f"{cfg['images_dir']} holds {len(paths)} JPEGs, not {want}")
    ds = JpegDataset(paths, crop=crop, seed=int(cfg.get("seed", 0)))
    # Warm what both sides need anyway (PIL's and torch's code paths, the files' pages) outside the timing.
    for i in range(min(len(ds), int(cfg.get("warmup_images", 8)))):
        ds[i]
    return ds


def _loader(torch, ds, cfg: dict):
    from torch.utils.data import DataLoader

    workers = int(cfg.get("workers", 0))
    kw = {
        "batch_size": int(cfg.get("batch", 32)),
        "shuffle": True,
        "num_workers": workers,
        "pin_memory": bool(cfg.get("pin_memory", False)),
        "drop_last": False,
        "generator": torch.Generator().manual_seed(int(cfg.get("seed", 0))),
    }
    if workers > 0:
        kw["persistent_workers"] = bool(cfg.get("persistent_workers", False))
    return DataLoader(ds, **kw)


def _model(torch, cfg: dict, dev):
    torch.manual_seed(int(cfg.get("seed", 0)))
    nn = torch.nn
    model = small_cnn(nn, list(cfg.get("channels", (16, 32, 64)))).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def run_pipeline(torch, cfg: dict, dev) -> dict:
    """decode -> random resized crop -> flip -> normalise -> collate, through a DataLoader: images/s over
    ``epochs`` epochs, worker start-up included (that is what a job pays each epoch without persistence).
    ``fill_pause``: after the first batch the consumer pauses (that factor times the first batch's wait,
    at least 0.5 s, left out of the timing), as a slow first training step would, so the workers fill
    their prefetch queues: workers x prefetch_factor batches in shared memory at once, what makes a small
    /dev/shm overflow."""
    ds = _dataset(cfg, int(cfg.get("crop", 224)))
    pin = bool(cfg.get("pin_memory", False))
    fill = float(cfg.get("fill_pause", 0.0))
    paused, shm_used = 0.0, None
    if dev.type == "cuda":
        torch.zeros(1, device=dev)  # CUDA context outside the timing
    dl = _loader(torch, ds, cfg)
    mark_start()
    n = 0
    t0 = time.perf_counter()
    for _ in range(int(cfg.get("epochs", 1))):
        for xb, _y in dl:
            if dev.type == "cuda":
                xb = xb.to(dev, non_blocking=pin)
            n += int(xb.shape[0])
            if fill and not paused:
                paused = max(0.5, fill * (time.perf_counter() - t0))
                time.sleep(paused)
                shm_used = shm_bytes() - shm_free_bytes() if shm_bytes() else None
    _sync(torch, dev)
    dt = time.perf_counter() - t0 - paused
    del dl  # persistent workers stop here, outside the timing
    out = {"metric": n / dt, "unit": "img/s", "items": n, "seconds": dt}
    if fill:
        out.update(paused_s=paused, shm_used_bytes=shm_used)
    return out


def run_train(torch, cfg: dict, dev) -> dict:
    """SGD steps of a small conv-net on a fixed batch: images/s over at least ``min_steps`` steps and
    ``measure_s`` seconds, after ``warmup_steps``."""
    step = _model(torch, cfg, dev)
    batch, size = int(cfg.get("batch", 32)), int(cfg.get("size", 112))
    g = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
    x = torch.randn(batch, 3, size, size, generator=g).to(dev)
    y = torch.randint(0, 10, (batch,), generator=g).to(dev)
    for _ in range(int(cfg.get("warmup_steps", 2))):
        step(x, y)
    _sync(torch, dev)
    mark_start()
    min_steps, measure_s = max(1, int(cfg.get("min_steps", 3))), float(cfg.get("measure_s", 1.0))
    steps = 0
    t0 = time.perf_counter()
    while steps < min_steps or (time.perf_counter() - t0 < measure_s and steps < 10_000):
        loss = step(x, y)
        steps += 1
    _sync(torch, dev)
    dt = time.perf_counter() - t0
    lv = float(loss.detach())
    if not math.isfinite(lv):
        raise RuntimeError(f"training loss is {lv}")
    return {
        "metric": batch * steps / dt,
        "unit": "img/s",
        "items": batch * steps,
        "steps": steps,
        "seconds": dt,
    }


def run_e2e(torch, cfg: dict, dev) -> dict:
    """The pipeline feeding the training step (crops at the model's input size): images/s."""
    ds = _dataset(cfg, int(cfg.get("size", 112)))
    step = _model(torch, cfg, dev)
    pin = bool(cfg.get("pin_memory", False))
    x0 = torch.stack([ds[i][0] for i in range(min(len(ds), int(cfg.get("batch", 32))))]).to(dev)
    y0 = torch.zeros(x0.shape[0], dtype=torch.long, device=dev)
    for _ in range(int(cfg.get("warmup_steps", 2))):
        step(x0, y0)
    _sync(torch, dev)
    dl = _loader(torch, ds, cfg)
    mark_start()
    n = 0
    t0 = time.perf_counter()
    for _ in range(int(cfg.get("epochs", 1))):
        for xb, yb in dl:
            step(xb.to(dev, non_blocking=pin), yb.to(dev, non_blocking=pin))
            n += int(xb.shape[0])
    _sync(torch, dev)
    dt = time.perf_counter() - t0
    del dl
    return {"metric": n / dt, "unit": "img/s", "items": n, "seconds": dt}


WORKLOADS = {"pipeline": run_pipeline, "train": run_train, "e2e": run_e2e}


# ----------------------------------------------------------------------------------------------- tasks


def task_probe(cfg: dict) -> dict:
    out = {
        "ok": True,
        "python": platform.python_version(),
        "executable": sys.executable,
        "tag": "cp{}{}".format(*sys.version_info[:2]),
        "machine": platform.machine(),
        "cpus": cpus(),
        "pil": pil_info(),
        "allocator": allocator_info(),
        "shm_bytes": shm_bytes(),
        "env": probe.env_vars(ENV_KEYS),
    }
    try:
        import torch
    except Exception as exc:
        out["torch"] = None
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
        return out
    t = {
        "version": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "cuda_available": False,
        "gpus": [],
    }
    try:
        t["cuda_available"] = bool(torch.cuda.is_available())
        if t["cuda_available"]:
            t["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:
        t["cuda_error"] = f"{type(exc).__name__}: {exc}"
    out["torch"] = t
    out["threads"] = threads_info(torch)
    return out


def task_images(cfg: dict) -> dict:
    t0 = time.perf_counter()
    paths = write_jpegs(
        cfg["dir"],
        int(cfg["images"]),
        size=tuple(cfg.get("size", (484, 402))),
        quality=int(cfg.get("quality", 90)),
        seed=int(cfg.get("seed", 0)),
    )
    return {"ok": True, "images": len(paths), "seconds": time.perf_counter() - t0, "pil": pil_info()}


def task_measure(cfg: dict) -> dict:
    expect = cfg.get("expect") or {}
    # The cheap proofs first: a wrong allocator or PIL is known before torch is imported.
    alloc = allocator_info()
    err = proof.allocator_error(expect.get("allocator"), expect.get("allocator_path"), alloc["mapped"])
    pil = pil_info()
    err = err or proof.pil_error(expect.get("pil"), pil)
    if err:
        return {"ok": False, "stage": "proof", "error": err, "allocator": alloc, "pil": pil}
    import torch

    dev = _device(torch, cfg.get("device", "auto"))
    data = WORKLOADS[cfg["workload"]](torch, cfg, dev)
    data.update(
        ok=True,
        workload=cfg["workload"],
        device=str(dev),
        torch=torch.__version__,
        allocator=alloc,
        pil=pil,
        threads=threads_info(torch),
        shm_bytes=shm_bytes(),
    )
    return data


TASKS = {"probe": task_probe, "images": task_images, "measure": task_measure}


# --------------------------------------------------------------------------------------------- serving


def hello(cfg: dict) -> dict:
    """Start-up of a serving process: the cheap proofs, then torch and PIL imported once; what it got."""
    t0 = time.perf_counter()
    expect = cfg.get("expect") or {}
    alloc = allocator_info()
    pil = pil_info()
    err = proof.allocator_error(expect.get("allocator"), expect.get("allocator_path"), alloc["mapped"])
    err = err or proof.pil_error(expect.get("pil"), pil)
    if err:
        return {"event": "hello", "ok": False, "stage": "proof", "error": err, "allocator": alloc, "pil": pil}
    import torch
    import torch.utils.data  # what every workload needs, imported before the first request

    # What start-up made stays for good: out of the collector's way (the collection after each request then
    # costs next to nothing, not 0.1 s) and out of the pages a forked DataLoader worker would copy.
    gc.collect()
    gc.freeze()
    return {
        "event": "hello",
        "ok": True,
        "pid": os.getpid(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "allocator": allocator_info(),
        "pil": pil,
        "threads": threads_info(torch),
        "shm_bytes": shm_bytes(),
        "startup_s": round(time.perf_counter() - t0, 3),
    }


def _answer_channel():
    """A copy of fd 1 for the answers, then fd 1 pointed at stderr: whatever else writes to stdout in this
    process or its children (torch, a DataLoader worker, a library's warning) cannot corrupt an answer."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", encoding="utf-8")


def _answer(out, rec: dict) -> None:
    out.write(json.dumps(rec, default=str) + "\n")
    out.flush()


def serve(argv: list[str]) -> int:
    """Hello, then one answer line per request line on stdin, until EOF (docs/bench.md, "How")."""
    global _serving
    out = _answer_channel()
    try:
        try:
            cfg = json.loads(argv[0]) if argv else {}
            if not isinstance(cfg, dict):
                raise ValueError("not a JSON object")
            rec = hello(cfg)
        except Exception as exc:
            rec = {
                "event": "hello",
                "ok": False,
                "stage": "startup",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        _answer(out, rec)
        if not rec["ok"]:
            return 3
        _serving = {"started": False}
        n = 0
        for raw in sys.stdin.buffer:
            if not raw.strip():
                continue
            n += 1
            _serving["started"] = False
            t0 = time.perf_counter()
            try:
                req = json.loads(raw)
                if not isinstance(req, dict):
                    raise ValueError("the request is not a JSON object")
                rec = task_measure(req)
            except Exception as exc:
                rec = {
                    "ok": False,
                    "stage": "measure",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:],
                }
            rec.update(started=_serving["started"], request=n, wall_s=round(time.perf_counter() - t0, 3))
            gc.collect()  # the DataLoader and its workers are gone before the next variant measures
            _answer(out, rec)
        return 0
    except BrokenPipeError:  # the orchestrator went away
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    stage = "config"
    try:
        cfg = json.loads(argv[0]) if argv else None
        if not isinstance(cfg, dict) or cfg.get("task", "measure") not in TASKS:
            sys.stderr.write(
                "usage: python -m hostcheck.inside.bench_worker '<json config>' | --serve '<json config>'\n"
            )
            return 2
        stage = cfg.get("task", "measure")
        t0 = time.perf_counter()
        rec = TASKS[stage](cfg)
        rec["wall_s"] = round(time.perf_counter() - t0, 3)
        emit(rec)
        return 0 if rec.get("ok") else 3
    except Exception as exc:
        emit(
            {
                "ok": False,
                "stage": stage,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
