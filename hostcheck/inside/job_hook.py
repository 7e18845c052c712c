"""The light hook ``hostcheck job`` loads into every Python of the user's job (through jobsite/sitecustomize.py).

Standard library only, Python >= 3.8, no hostcheck import: it runs in the user's interpreter, which may not have
hostcheck installed. Inert until torch is imported: a ``sys.meta_path`` finder waits for ``torch`` and patches
a few of its functions once the import has finished. Nothing here changes what the job computes: each wrapper
calls the original with the same arguments and returns what it returned; every error of the hook's own is
caught, and the hook then stops recording (it never raises into the user's program).

What it records, per process, into ``$HOSTCHECK_JOB_DIR/hook-<pid>-<n>.jsonl`` (JSON lines, appended at most
once a second from the main thread and at exit; nothing at all for a process that never iterates a DataLoader):

- every DataLoader batch: when the main thread asked for it and when it got it (the time inside ``next()`` is
  the data wait; the time from one batch's arrival to the next request is the step);
- each DataLoader's settings (num_workers, pin_memory, persistent_workers, prefetch_factor, batch size, the
  dataset's class and root, the worker pids);
- optimizer steps (torch's global step post-hook), autocast use (``torch.autocast.__enter__``), channels_last
  weights and cudnn.benchmark at the first step, torch's thread count, PIL's version;
- time inside explicit ``torch.distributed`` collectives (each call's start and end, so the loop's share can be
  told from a wait at the end of the run) and DDP's own backward compute/communication timers. A collective on
  CUDA tensors is timed on the GPU (CUDA events on the tensor's current stream, read without a synchronize: see
  ``_Gpu``); one on CPU tensors (gloo) by the host clock, and each call's record says which;
- where the loop's thread is between batches: from the first batch on, a thread of the hook's own samples that
  thread's Python stack (``sys._current_frames``) and its kernel wait channel and state
  (``/proc/self/task/<tid>/wchan`` and ``stat``) every STACK_S seconds, and counts the top frames;
- an uncaught exception's type and message (DataLoader worker deaths end a job this way).

DataLoader workers are forked or spawned copies: they load the hook too, but never iterate a DataLoader, so they
write nothing; the orchestrator reads their CPU from /proc.

Why one module: it is loaded by path into every Python the job starts, before the user's code; one file is one
open and one module name added to the user's sys.modules, and none of its parts is of use without the others.
"""

import contextlib
import os
import sys
import time

DIR_VAR = "HOSTCHECK_JOB_DIR"
#: Records reach the file at most this often (seconds): the cost is one write per second, not per step.
FLUSH_S = 1.0
#: Iterator states kept at once (a job that makes a DataLoader per step must not grow the hook without bound).
MAX_ITERS = 256
#: Batches recorded one by one per process; past this only their count and sums are kept.
DETAIL_CAP = 500_000
#: Optimizer steps after which DDP's timers are read at every step (then once a second).
DDP_EARLY_STEPS = 12
#: The collectives timed: on the GPU for CUDA tensors (blocking calls whole; asynchronous ones from their
#: ``Work.wait()``), by the host clock otherwise.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "all_to_all_single",
    "reduce",
)
#: Collective calls recorded one by one (start, end) per process; past this only their sums are kept.
COLL_CAP = 100_000
#: How each collective's time was taken: "gpu" (CUDA events), "host" (the host clock: CPU tensors, gloo, a call
#: without a tensor such as barrier, or a call that raised), "launch" (only the Python call of an asynchronous
#: collective that was never waited for, or whose GPU events were dropped unread: under-measured).
CLOCKS = ("gpu", "host", "launch")
#: Timed collectives whose CUDA events may wait unread at once; past this the oldest keeps its launch time.
GPU_PENDING = 1024
#: Asynchronous collectives (their Work) kept until waited for; past this the oldest keeps its launch time.
WORK_TRACKED = 1024
#: Idle CUDA events kept per device for reuse (an event is created once, not per call).
EVENT_POOL = 64
#: At exit, events still unfinished are polled this many times, 5 ms apart (at most 2 s), never synchronized.
FINAL_POLLS = 400
#: The loop thread's stack is sampled this often (seconds): low enough to cost nothing a step can see.
STACK_S = 0.1
#: Frames kept per stack sample (the innermost ones), and distinct stacks / wait channels counted.
STACK_DEPTH = 4
STACK_KEYS = 32
_ATTR = "_hostcheck_job_state"
_clock = time.monotonic


class _Iter:
    """One DataLoader iterator's pending batch times (start, end pairs) since the last flush."""

    __slots__ = ("buf", "ended", "id", "last")

    def __init__(self, n):
        self.id = n
        self.buf = []
        self.ended = False
        self.last = 0.0


class _Pending:
    """One collective's CUDA events, recorded on a stream and read once both have finished."""

    __slots__ = ("dev", "ev0", "ev1", "key", "name", "t0", "t1")

    def __init__(self, name, t0, t1, dev, key, ev0, ev1):
        self.name, self.t0, self.t1 = name, t0, t1
        self.dev, self.key, self.ev0, self.ev1 = dev, key, ev0, ev1


class _Gpu:
    """GPU timing of collectives, without a synchronize in the training loop.

    A collective on CUDA tensors returns once it is enqueued, so the Python call's time says nothing of the
    communication. Around a blocking call, one CUDA event is recorded on the tensor's current stream before it
    and one after it: torch makes that stream wait for the collective before returning, so the second event
    finishes when the collective has. An asynchronous call (``async_op=True``) returns a ``Work``; its events are
    recorded around the job's ``Work.wait()`` instead, which is where the stream waits for it: the time between
    them is how long the stream stood still for the communication (what it cost the loop, not the part hidden
    behind compute). Events are read later, with ``query()`` only (it never blocks): a few at each call and all
    the finished ones at each flush (at most once a second, between steps). Each is placed on the host's clock
    at the earliest time both the call and the stream's order allow: not before the call, and after the
    previous collective on that stream by the gap the two events show. At most ``GPU_PENDING`` wait unread.
    """

    def __init__(self):
        self.off = None  # why GPU timing stopped (then the host clock times everything)
        self.pending = []
        self.head = 0
        self.pool = {}
        self.chain = {}
        self.works = {}
        self.lock = None

    def event(self, torch, dev):
        free = self.pool.get(dev)
        if free:
            try:
                return free.pop()
            except IndexError:  # another thread took the last one
                pass
        return torch.cuda.Event(enable_timing=True)

    def release(self, dev, ev):
        free = self.pool.setdefault(dev, [])
        if len(free) < EVENT_POOL:
            free.append(ev)


class _State:
    def __init__(self):
        self.dir = None
        self.pid = os.getpid()
        self.off = False
        self.path = None
        self.file = None
        self.pending = []
        self.iters = []
        self.next_iter = 0
        self.last_flush = _clock()
        self.batches = 0
        self.summed = [0, 0.0, 0.0]  # batches past DETAIL_CAP: count, wait seconds, seconds between batches
        self.last_end = None
        self.opt_steps = 0
        self.first_step = None
        self.last_ddp = 0.0
        self.autocast = None
        self.autocast_n = 0
        self.coll = {}
        self.coll_buf = []
        self.coll_n = 0
        self.clocks = {}
        self.gpu = _Gpu()
        self.ddp = []
        self.ddp_data = {}
        self.error = None
        self.patched = []
        self.stacks = None
        self.stacks_written = 0
        self.sampler = None


_S = _State()


def _broken(where):
    """A failure of the hook itself: stop recording, keep the job running untouched."""
    _S.off = True
    with contextlib.suppress(Exception):
        sys.stderr.write(f"hostcheck job hook: stopped recording ({where}: {sys.exc_info()[1]!r})\n")


def _signalled(exc):
    """Whether ``exc`` was raised by a Python signal handler that ran while our code did (torch's SIGCHLD
    handler raises "DataLoader worker ... exited unexpectedly" wherever the main thread is): it is the job's,
    not ours, and must go on up as it would have without the hook."""
    try:
        import signal

        codes = set()
        for sig in signal.valid_signals():
            code = getattr(signal.getsignal(sig), "__code__", None)
            if code is not None:
                codes.add(code)
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return True
            tb = tb.tb_next
    except Exception:
        pass
    return False


def _proc_record():
    env = os.environ
    rec = {
        "k": "proc",
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": [str(a)[:200] for a in (getattr(sys, "argv", None) or [])[:20]],
        "python": sys.version.split()[0],
        "mono": _clock(),
        "wall": time.time(),
        "cpus": os.cpu_count(),
        "env": {
            k: env[k]
            for k in (
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "LOCAL_WORLD_SIZE",
                "OMP_NUM_THREADS",
                "MKL_NUM_THREADS",
                "CUDA_VISIBLE_DEVICES",
            )
            if k in env
        },
    }
    with contextlib.suppress(Exception):
        rec["affinity"] = len(os.sched_getaffinity(0))
    torch = sys.modules.get("torch")
    if torch is not None:
        rec["torch"] = str(getattr(torch, "__version__", ""))
    return rec


def _open():
    n = 0
    while True:
        path = os.path.join(_S.dir, f"hook-{os.getpid()}-{n}.jsonl")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:  # a pid reused within one run
            n += 1
    _S.path = path
    _S.file = os.fdopen(fd, "w", encoding="utf-8")
    _S.pending.insert(0, _proc_record())


def flush(final=False):
    """Write what is pending (from the main thread, between batches, and at exit)."""
    if _S.off or _S.dir is None or os.getpid() != _S.pid:
        return
    try:
        import json

        _S.last_flush = _clock()
        for it in _S.iters:
            if it.buf:
                _S.pending.append({"k": "b", "it": it.id, "t": [round(x, 6) for x in it.buf]})
                it.buf = []
        if len(_S.iters) > MAX_ITERS // 2:
            _S.iters = [it for it in _S.iters if not it.ended][-MAX_ITERS // 2 :]
        _collectives_read(final)
        if _S.coll_buf:
            buf, _S.coll_buf = _S.coll_buf, []
            _S.pending.append({"k": "c", "c": [[n, round(a, 6), round(b, 6), k] for n, a, b, k in buf]})
        st = _S.stacks
        if st is not None and st.n != _S.stacks_written:
            _S.stacks_written = st.n
            _S.pending.append(st.record())
        if _S.summed[0]:
            n, wait, gaps = _S.summed
            _S.pending.append({"k": "sum", "n": n, "wait": round(wait, 6), "gaps": round(gaps, 6)})
            _S.summed = [0, 0.0, 0.0]
        if final:
            _S.pending.append(_final_record())
        if not _S.pending:
            return
        if _S.file is None:
            _open()
        lines = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in _S.pending)
        _S.pending = []
        _S.file.write(lines)
        _S.file.flush()
    except Exception as exc:
        if _signalled(exc):
            raise
        _broken("writing records")


def _collectives_read(final):
    """The collectives' CUDA events that have finished, and the Works that died unwaited. At exit, what is
    still running is polled for a bounded time (never a synchronize: a hung collective must not hang the exit),
    and what then remains keeps its launch time."""
    g = _S.gpu
    if g.head < len(g.pending):
        _poll()
        if final:
            for _round in range(FINAL_POLLS):
                if g.head >= len(g.pending) or g.off is not None:
                    break
                time.sleep(0.005)
                _poll()
            _drop_pending()
    if g.works:
        _untracked_works(final)


def _maybe_flush(now):
    if now - _S.last_flush >= FLUSH_S:
        flush()


# --- DataLoader -------------------------------------------------------------------------------------------
def _iter_state(it):
    st = it.__dict__.get(_ATTR)
    if st is None:
        st = _Iter(_S.next_iter)
        _S.next_iter += 1
        it.__dict__[_ATTR] = st
        _S.iters.append(st)
        _S.pending.append(_iter_record(it, st))
    return st


def _iter_record(it, st):
    rec = {"k": "it", "it": st.id, "t": _clock(), "kind": type(it).__name__}
    loader = it.__dict__.get("_hostcheck_job_loader") or {}
    rec.update(loader)
    rec["num_workers"] = getattr(it, "_num_workers", None)
    rec["pin_memory_effective"] = bool(getattr(it, "_pin_memory", False))
    rec["persistent_workers"] = getattr(it, "_persistent_workers", None)
    if "prefetch_factor" not in rec:
        rec["prefetch_factor"] = getattr(it, "_prefetch_factor", None)
    sampler = getattr(it, "_index_sampler", None)
    rec["batch_size"] = getattr(sampler, "batch_size", None)
    ds = getattr(it, "_dataset", None)
    rec["dataset"] = type(ds).__name__ if ds is not None else None
    root = getattr(ds, "root", None)
    if root is not None and isinstance(root, (str, os.PathLike)):
        rec["dataset_root"] = os.path.abspath(os.fspath(root))
    workers = getattr(it, "_workers", None) or []
    rec["workers"] = [w.pid for w in workers if getattr(w, "pid", None)]
    if workers:
        rec["worker_kind"] = type(workers[0]).__name__
    return rec


def _batch(it, start, end):
    if _S.off:
        return
    st = _iter_state(it)
    _S.batches += 1
    if _S.batches == 1:
        _start_stacks()
    stacks = _S.stacks
    if stacks is not None and stacks.pending:
        stacks.commit()
    if _S.batches <= DETAIL_CAP:
        st.buf.append(start)
        st.buf.append(end)
    else:
        _S.summed[0] += 1
        _S.summed[1] += end - start
        if _S.last_end is not None:
            _S.summed[2] += start - _S.last_end
    st.last = end
    _S.last_end = end
    _maybe_flush(end)


def _epoch_end(it, now):
    if _S.off:
        return
    st = _iter_state(it)
    if st.buf:
        _S.pending.append({"k": "b", "it": st.id, "t": [round(x, 6) for x in st.buf]})
        st.buf = []
    _S.pending.append({"k": "e", "it": st.id, "t": now})
    _S.last_end = None
    if _S.stacks is not None:
        _S.stacks.drop()
    if not getattr(it, "_persistent_workers", False):
        st.ended = True


def _batch_error(it, start, exc):
    if _S.off:
        return
    st = _iter_state(it)
    _S.pending.append({"k": "err", "it": st.id, "t": _clock(), "where": "next", **_describe(exc)})
    flush()


def _describe(exc):
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    out = {"type": type(exc).__name__, "message": text[:2000]}
    if cause is not None:
        out["cause"] = f"{type(cause).__name__}: {str(cause)[:500]}"
    return out


def _wrap_next_data(orig):
    def _next_data(self):
        start = _clock()
        try:
            data = orig(self)
        except StopIteration:
            try:
                _epoch_end(self, _clock())
            except Exception as exc:
                if _signalled(exc):
                    raise
                _broken("epoch end")
            raise
        except Exception as exc:
            try:
                _batch_error(self, start, exc)
            except Exception as err:
                if _signalled(err):
                    raise
                _broken("batch error")
            raise
        try:
            _batch(self, start, _clock())
        except Exception as exc:
            if _signalled(exc):
                raise
            _broken("batch")
        return data

    _next_data.__wrapped__ = orig
    _next_data.__name__ = getattr(orig, "__name__", "_next_data")
    _next_data.__qualname__ = getattr(orig, "__qualname__", "_next_data")
    return _next_data


def _wrap_get_iterator(orig):
    def _get_iterator(self):
        it = orig(self)
        try:
            settings = {
                "pin_memory": bool(self.pin_memory),
                "prefetch_factor": self.prefetch_factor,
                "timeout": self.timeout,
            }
            ctx = self.multiprocessing_context
            if ctx is not None:
                settings["mp_context"] = ctx if isinstance(ctx, str) else type(ctx).__name__
            it.__dict__["_hostcheck_job_loader"] = settings
        except Exception as exc:  # the settings are a nicety; the batch times do not need them
            if _signalled(exc):
                raise
        return it

    _get_iterator.__wrapped__ = orig
    return _get_iterator


def _patch_dataloader(dl):
    for cls_name in ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter"):
        cls = getattr(dl, cls_name, None)
        orig = cls.__dict__.get("_next_data") if cls is not None else None
        if orig is not None:
            _set(cls, "_next_data", _wrap_next_data(orig))
    loader = getattr(dl, "DataLoader", None)
    if loader is not None and "_get_iterator" in loader.__dict__:
        _set(loader, "_get_iterator", _wrap_get_iterator(loader.__dict__["_get_iterator"]))


# --- optimizer steps, autocast, model layout ----------------------------------------------------------------
def _after_step(optimizer, args, kwargs):
    try:
        if _S.off:
            return
        _S.opt_steps += 1
        now = _clock()
        if _S.first_step is None:
            _S.first_step = now
            _S.pending.append(_model_record(optimizer, now))
        # DDP fills its timers in its first iterations, then every 100th: read them each step at first.
        if _S.ddp and (_S.opt_steps <= DDP_EARLY_STEPS or now - _S.last_ddp >= FLUSH_S):
            _S.last_ddp = now
            _read_ddp()
        _maybe_flush(now)
    except Exception as exc:
        if _signalled(exc):
            raise
        _broken("optimizer step")


def _model_record(optimizer, now):
    torch = sys.modules["torch"]
    devices = {}
    conv = cl = 0
    for group in getattr(optimizer, "param_groups", []):
        for p in group.get("params", []):
            dev = getattr(getattr(p, "device", None), "type", "?")
            devices[dev] = devices.get(dev, 0) + 1
            if getattr(p, "dim", None) is not None and p.dim() == 4:
                conv += 1
                if p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous():
                    cl += 1
    rec = {
        "k": "model",
        "t": now,
        "optimizer": type(optimizer).__name__,
        "param_devices": devices,
        "conv_weights": conv,
        "channels_last_weights": cl,
        "threads": torch.get_num_threads(),
    }
    with contextlib.suppress(Exception):
        rec["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    return rec


def _patch_optimizer(optim):
    register = getattr(optim, "register_optimizer_step_post_hook", None)
    if register is not None:
        _S.patched.append(("hook", register(_after_step)))


def _wrap_autocast_enter(orig):
    def __enter__(self):
        try:
            _S.autocast_n += 1
            if _S.autocast is None:
                _S.autocast = {
                    "device": str(getattr(self, "device", "")),
                    "dtype": str(getattr(self, "fast_dtype", "")),
                    "enabled": bool(getattr(self, "_enabled", True)),
                }
        except Exception as exc:
            if _signalled(exc):
                raise
        return orig(self)

    __enter__.__wrapped__ = orig
    return __enter__


def _patch_autocast(mode):
    cls = getattr(mode, "autocast", None)
    if cls is not None and "__enter__" in cls.__dict__:
        _set(cls, "__enter__", _wrap_autocast_enter(cls.__dict__["__enter__"]))


# --- distributed --------------------------------------------------------------------------------------------
def _first_tensor(args, kwargs):
    """The CUDA tensor (or the first of a tensor list) a collective works on; None for a CPU tensor or a call
    without one (barrier)."""
    x = args[0] if args else None
    if x is None:
        for key in ("tensor", "output_tensor", "output", "tensor_list"):
            x = kwargs.get(key)
            if x is not None:
                break
    if type(x) in (list, tuple):
        x = x[0] if x else None
    return x if getattr(x, "is_cuda", False) is True and getattr(x, "device", None) is not None else None


def _begin(device):
    """A start event on ``device``'s current stream: (device index, stream, event), or None when the call is
    host timed (GPU timing stopped, or a CUDA graph being captured: a timing event would break the capture)."""
    g = _S.gpu
    if g.off is not None:
        return None
    torch = sys.modules["torch"]
    if torch.cuda.is_current_stream_capturing():
        return None
    dev = device.index
    stream = torch.cuda.current_stream(device)
    ev = g.event(torch, dev)
    ev.record(stream)
    return dev, stream, ev


def _gpu_failed(exc):
    _S.gpu.off = f"{type(exc).__name__}: {exc}"[:200]


def _add(name, a, b, clock):
    """One collective's time, taken: per name (count, seconds) was counted at the call, seconds here."""
    c = _S.coll.get(name)
    if c is None:
        c = _S.coll[name] = [0, 0.0]
    c[1] += b - a
    _S.clocks[clock] = _S.clocks.get(clock, 0) + 1
    if _S.coll_n < COLL_CAP:
        _S.coll_n += 1
        _S.coll_buf.append((name, a, b, clock))


def _pend(name, t0, t1, begun):
    """The end event after a call (or a wait) that began with ``begun``; read later by _poll."""
    g = _S.gpu
    dev, stream, ev0 = begun
    ev1 = g.event(sys.modules["torch"], dev)
    ev1.record(stream)
    g.pending.append(_Pending(name, t0, t1, dev, (dev, getattr(stream, "cuda_stream", id(stream))), ev0, ev1))
    if len(g.pending) - g.head > GPU_PENDING:
        _poll(limit=len(g.pending))
        if len(g.pending) - g.head > GPU_PENDING:  # the GPU is that far behind: keep the oldest's launch time
            old = g.pending[g.head]
            g.pending[g.head] = None
            g.head += 1
            _add(old.name, old.t0, old.t1, "launch")
    _poll(limit=2)


def _poll(limit=None):
    """Read the events that have finished, oldest first (each entry's second event finishes after its first:
    both are on one stream). Never waits; another thread already polling is left to it."""
    g = _S.gpu
    if g.lock is None:
        import threading

        g.lock = threading.Lock()
    if not g.lock.acquire(blocking=False):
        return
    try:
        n = 0
        while g.head < len(g.pending) and (limit is None or n < limit):
            p = g.pending[g.head]
            if not p.ev1.query():
                break
            g.pending[g.head] = None
            g.head += 1
            n += 1
            try:
                _resolve(p)
            except Exception:
                _add(p.name, p.t0, p.t1, "launch")
                raise
        if g.head > 256 and g.head * 2 > len(g.pending):
            del g.pending[: g.head]
            g.head = 0
    except Exception as exc:
        if _signalled(exc):
            raise
        _gpu_failed(exc)
        _drop_pending()
    finally:
        g.lock.release()


def _resolve(p):
    g = _S.gpu
    dur = max(0.0, p.ev0.elapsed_time(p.ev1) / 1000.0)
    start = p.t0
    prev = g.chain.get(p.key)
    if prev is not None:
        start = max(start, prev[1] + max(0.0, prev[0].elapsed_time(p.ev0) / 1000.0))
        g.release(p.dev, prev[0])
    g.chain[p.key] = (p.ev1, start + dur)
    g.release(p.dev, p.ev0)
    _add(p.name, start, max(p.t1, start + dur), "gpu")


def _drop_pending():
    """GPU timing stopped (or the process is ending): what was not read keeps its launch time."""
    g = _S.gpu
    for p in g.pending[g.head :]:
        if p is not None:
            _add(p.name, p.t0, p.t1, "launch")
    g.pending, g.head, g.chain = [], 0, {}


def _track(work, name, t0, t1, tensor):
    """An asynchronous collective: timed when the job waits for it (or by its launch, if it never does)."""
    import weakref

    g = _S.gpu
    g.works[id(work)] = (weakref.ref(work), name, t0, t1, None if tensor is None else tensor.device)
    if len(g.works) > WORK_TRACKED:
        key = next(iter(g.works))
        entry = g.works.pop(key)
        _add(entry[1], entry[2], entry[3], "launch")


def _untracked_works(final=False):
    """Works that died, or (at exit) were never waited for: their launch time is all there is."""
    g = _S.gpu
    for key, (ref, n, a, b, _device) in list(g.works.items()):
        if final or ref() is None:
            del g.works[key]
            _add(n, a, b, "launch")


def _guarded(fn, *args):
    """``fn(*args)`` for the collectives' timing: an error of the hook's own stops GPU timing (the host clock goes
    on) and never reaches the job; one a signal handler raised does."""
    try:
        return fn(*args)
    except Exception as exc:
        if _signalled(exc):
            raise
        _gpu_failed(exc)
        return None


def _timed(name, t0, t1, begun, ok):
    """A call's (or a wait's) time: from its CUDA events when it began with some and returned, else the host's."""
    if ok and begun is not None and _S.gpu.off is None:
        _pend(name, t0, t1, begun)
    else:
        _add(name, t0, t1, "host")


def _ended(name, t0, t1, begun, ok, out, tensor):
    if _S.off:
        return
    c = _S.coll.get(name)
    if c is None:
        c = _S.coll[name] = [0, 0.0]
    c[0] += 1
    if ok and callable(getattr(out, "wait", None)):  # asynchronous: timed at its wait
        if begun is not None:
            _S.gpu.release(begun[0], begun[2])
        _track(out, name, t0, t1, tensor)
    else:
        _timed(name, t0, t1, begun, ok)


def _wrap_collective(name, orig):
    def collective(*args, **kwargs):
        t0 = _clock()
        tensor = begun = out = None
        if not _S.off:
            try:
                tensor = _first_tensor(args, kwargs)
                if tensor is not None:
                    begun = _begin(tensor.device)
            except Exception as exc:
                if _signalled(exc):
                    raise
                _gpu_failed(exc)
        ok = False
        try:
            out = orig(*args, **kwargs)
            ok = True
            return out
        finally:
            _guarded(_ended, name, t0, _clock(), begun, ok, out, tensor)

    collective.__wrapped__ = orig
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(Exception):
            setattr(collective, attr, getattr(orig, attr))
    return collective


def _wrap_wait(orig):
    """``Work.wait``: an asynchronous collective the hook launched is timed here, where the job waits for it."""

    def collective_wait(self, *args, **kwargs):
        works = _S.gpu.works
        entry = works.pop(id(self), None) if works else None
        if entry is None or entry[0]() is not self:
            if entry is not None:  # an id reused after its Work died: that one was never waited for
                _add(entry[1], entry[2], entry[3], "launch")
            return orig(self, *args, **kwargs)
        name, device = entry[1], entry[4]
        w0 = _clock()
        begun = None if device is None else _guarded(_begin, device)
        ok = False
        try:
            out = orig(self, *args, **kwargs)
            ok = True
            return out
        finally:
            _guarded(_timed, name, w0, _clock(), begun, ok)

    collective_wait.__wrapped__ = orig
    with contextlib.suppress(Exception):
        collective_wait.__doc__ = orig.__doc__
    return collective_wait


def _patch_distributed(dist):
    if not getattr(dist, "is_available", lambda: False)():
        return
    for name in COLLECTIVES:
        orig = getattr(dist, name, None)
        if callable(orig):
            _set(dist, name, _wrap_collective(name, orig))
    work = getattr(dist, "Work", None)
    if work is not None and callable(work.__dict__.get("wait")):
        _set(work, "wait", _wrap_wait(work.__dict__["wait"]))


def _wrap_ddp_init(orig):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        try:
            import weakref

            _S.ddp.append(weakref.ref(self))
        except Exception as exc:
            if _signalled(exc):
                raise

    __init__.__wrapped__ = orig
    return __init__


def _patch_ddp(module):
    cls = getattr(module, "DistributedDataParallel", None)
    if cls is not None and "__init__" in cls.__dict__:
        _set(cls, "__init__", _wrap_ddp_init(cls.__dict__["__init__"]))


DDP_KEYS = (
    "avg_forward_compute_time",
    "avg_backward_compute_time",
    "avg_backward_comm_time",
    "avg_backward_compute_comm_overlap_time",
    "backend_name",
    "world_size",
    "iteration",
)


def _read_ddp():
    live = [r() for r in _S.ddp]
    _S.ddp = [r for r, m in zip(_S.ddp, live) if m is not None]
    for i, m in enumerate(x for x in live if x is not None):
        data = m._get_ddp_logging_data()
        _S.ddp_data[i] = {k: data[k] for k in DDP_KEYS if k in data}


# --- where the loop's thread is between batches -------------------------------------------------------------
class _Stacks:
    """Counts of the loop thread's stack samples: by state (data: inside next(); comm: inside a collective;
    step: anywhere else), and for the step samples the top frames, the kernel wait channel and the thread's
    scheduler state (R running, S sleeping, D in uninterruptible I/O). A sample counts only once the loop goes
    on (the next batch arrives): until then it is pending, and one taken after the last batch or between
    epochs is counted as ``outside`` the loop. Updated under ``lock``; the main thread copies it when it
    writes."""

    def __init__(self, ident, tid):
        import threading

        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ident, self.tid = ident, tid
        self.n = 0
        self.pending = []
        self.where = {"data": 0, "comm": 0, "step": 0, "outside": 0}
        self.top = {}
        self.wchan = {}
        self.state = {}
        self.error = None

    def commit(self):
        """The loop went on: the pending samples were in it."""
        with self.lock:
            for where, top, wchan, state in self.pending:
                self.where[where] += 1
                if where == "step":
                    _count(self.top, top)
                    if wchan is not None:
                        _count(self.wchan, wchan)
                    if state is not None:
                        _count(self.state, state)
            self.pending = []

    def drop(self):
        """An epoch ended: the pending samples were not in a step."""
        with self.lock:
            self.where["outside"] += len(self.pending)
            self.pending = []

    def record(self):
        with self.lock:
            where = dict(self.where)
            where["outside"] += len(self.pending)
            return {
                "k": "stk",
                "interval": STACK_S,
                "tid": self.tid,
                "n": self.n,
                "where": where,
                "top": sorted(self.top.items(), key=lambda kv: -kv[1])[:STACK_KEYS],
                "wchan": dict(self.wchan),
                "state": dict(self.state),
                "error": self.error,
            }


def _count(d, key):
    if key in d or len(d) < STACK_KEYS:
        d[key] = d.get(key, 0) + 1
    else:
        d["(other)"] = d.get("(other)", 0) + 1


_HOOK_FILE = _broken.__code__.co_filename


def _read_small(path):
    with open(path, "rb") as f:
        return f.read(512).decode("ascii", "replace")


def _stack_sample(st):
    frame = sys._current_frames().get(st.ident)
    if frame is None:
        return False
    where, frames, f, depth = "step", [], frame, 0
    while f is not None and depth < 256:
        code = f.f_code
        if code.co_filename == _HOOK_FILE:
            if code.co_name == "_next_data":
                where = "data"
            elif code.co_name in ("collective", "collective_wait"):
                where = "comm"
        elif len(frames) < STACK_DEPTH:
            frames.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{f.f_lineno})")
        f = f.f_back
        depth += 1
    del frame, f
    wchan = state = None
    if where == "step" and st.tid:
        base = f"/proc/self/task/{st.tid}/"
        with contextlib.suppress(OSError):
            wchan = _read_small(base + "wchan").strip() or "0"
        with contextlib.suppress(OSError, IndexError):
            state = _read_small(base + "stat").rpartition(")")[2].split()[0]
    with st.lock:
        st.n += 1
        if len(st.pending) < 10_000:
            st.pending.append(
                (where, " < ".join(frames) or "?", None if wchan is None else wchan[:64], state and state[:2])
            )
    return True


def _stack_loop(st, pid):
    while not st.stop.wait(STACK_S):
        if _S.off or os.getpid() != pid:
            return
        try:
            if not _stack_sample(st):
                return  # the loop's thread has ended
        except Exception as exc:  # the samples are evidence, not the job: stop them, keep recording
            st.error = f"{type(exc).__name__}: {exc}"[:200]
            return


def _start_stacks():
    import threading

    tid = threading.get_native_id() if hasattr(threading, "get_native_id") else None
    st = _Stacks(threading.get_ident(), tid)
    t = threading.Thread(target=_stack_loop, args=(st, os.getpid()), name="hostcheck-job-stacks", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no thread to be had: the report goes without stack samples
        return
    _S.stacks, _S.sampler = st, t


def _stop_stacks():
    st, t = _S.stacks, _S.sampler
    if st is None or t is None or os.getpid() != _S.pid:
        return
    with contextlib.suppress(Exception):
        st.stop.set()
        t.join(1.0)


# --- exit, exceptions, activation ---------------------------------------------------------------------------
def _final_record():
    rec = {"k": "final", "t": _clock(), "opt_steps": _S.opt_steps, "autocast": _S.autocast}
    rec["autocast_entries"] = _S.autocast_n
    rec["collectives"] = {k: [v[0], round(v[1], 6)] for k, v in _S.coll.items()}
    rec["collective_calls_timed"] = _S.coll_n
    rec["collective_clocks"] = dict(_S.clocks)
    if _S.gpu.off is not None:
        rec["collective_gpu_error"] = _S.gpu.off
    try:
        if _S.ddp:
            _read_ddp()
    except Exception as exc:
        if _signalled(exc):
            raise
    rec["ddp"] = list(_S.ddp_data.values())
    torch = sys.modules.get("torch")
    try:
        rec["threads"] = torch.get_num_threads() if torch is not None else None
        rec["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark) if torch is not None else None
    except Exception as exc:
        if _signalled(exc):
            raise
    pil = sys.modules.get("PIL")
    if pil is not None:
        version = str(getattr(pil, "__version__", ""))
        rec["pil"] = {"version": version, "simd": ".post" in version}
    if _S.error:
        rec["error"] = _S.error
    return rec


def _at_exit():
    _stop_stacks()
    if os.getpid() == _S.pid and not _S.off and (_S.file is not None or _S.pending or _S.batches):
        flush(final=True)


def _wrap_excepthook(previous):
    def excepthook(kind, value, tb):
        try:
            if os.getpid() == _S.pid and value is not None:
                _S.error = _describe(value)
        except Exception as exc:
            if _signalled(exc):
                raise
        return previous(kind, value, tb)

    return excepthook


def _after_fork_in_child():
    # A forked copy (a DataLoader worker) starts with nothing pending and no file: it records only what it
    # iterates itself, into a file of its own.
    _S.pid = os.getpid()
    _S.file = None
    _S.path = None
    _S.pending = []
    _S.iters = []
    _S.batches = 0
    _S.summed = [0, 0.0, 0.0]
    _S.last_end = None
    _S.opt_steps = 0
    _S.first_step = None
    _S.ddp = []
    _S.ddp_data = {}
    _S.error = None
    _S.coll_buf = []
    _S.coll_n = 0
    _S.clocks = {}
    _S.gpu = _Gpu()  # CUDA does not survive fork either
    _S.stacks = None
    _S.stacks_written = 0
    _S.sampler = None  # threads do not survive fork


def _set(owner, name, value):
    _S.patched.append((owner, name, owner.__dict__.get(name)))
    setattr(owner, name, value)


#: Module name -> what to patch once it has been imported.
PATCHES = {
    "torch.utils.data.dataloader": _patch_dataloader,
    "torch.optim.optimizer": _patch_optimizer,
    "torch.amp.autocast_mode": _patch_autocast,
    "torch.distributed": _patch_distributed,
    "torch.nn.parallel.distributed": _patch_ddp,
}
_done = set()


def _apply(name):
    module = sys.modules.get(name)
    if module is None or name in _done:
        return
    _done.add(name)
    try:
        PATCHES[name](module)
    except Exception as exc:
        if _signalled(exc):
            raise
        _broken(f"patching {name}")


def _on_import(name):
    if name == "torch":
        for other in PATCHES:
            _apply(other)
        sys.excepthook = _wrap_excepthook(sys.excepthook)
        return
    if "torch" in _done_torch:
        _apply(name)


_done_torch = set()


class _Loader:
    """The real loader of a watched module, with our patches applied once it has executed."""

    def __init__(self, real, name):
        self._real = real
        self._name = name

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        try:
            if self._name == "torch":
                _done_torch.add("torch")
            _on_import(self._name)
        except Exception as exc:
            if _signalled(exc):
                raise
            _broken("after import")

    def __getattr__(self, name):
        return getattr(self._real, name)


class _Finder:
    """Waits for torch (and the torch modules PATCHES names, when torch loads them lazily)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch" and (name not in PATCHES or name in _done):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


def install(run_dir=None):
    """Start watching for torch; records go to ``run_dir`` (default: $HOSTCHECK_JOB_DIR). False when off."""
    run_dir = run_dir or os.environ.get(DIR_VAR)
    if not run_dir or not os.path.isdir(run_dir):
        return False
    _S.dir = run_dir
    _S.pid = os.getpid()
    import atexit

    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    if "torch" in sys.modules:  # imported before us (tests): patch now
        _done_torch.add("torch")
        _on_import("torch")
    else:
        sys.meta_path.insert(0, _Finder())
    return True


def uninstall():
    """Undo the patches (tests); records already written stay."""
    for entry in reversed(_S.patched):
        if entry[0] == "hook":
            entry[1].remove()
            continue
        owner, name, orig = entry
        if orig is None:
            delattr(owner, name)
        else:
            setattr(owner, name, orig)
    _S.patched = []
    _done.clear()
    _done_torch.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
