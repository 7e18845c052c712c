"""One rank of ``hostcheck sweep`` in the training Python: ``-m hostcheck.inside.sweep --json-args JSON``.

``hostcheck sweep`` starts one of these per GPU of its node (NCCL), or one per node without GPUs (gloo). The
control plane is torch's TCPStore at MASTER_ADDR:MASTER_PORT, kept by rank 0 (or by torchrun's agent, which
already holds it), under a prefix of the run's id:

1. each rank claims its (node, local) slot once (a slot taken twice: another sweep on the same port); each node
   says who it is; rank 0 waits ``join_timeout_s`` for every node, then publishes the plan: the nodes that came
   (those that did not are named, the others are swept), or why the sweep cannot run;
2. the process group (NCCL or gloo) over the nodes that came; every phase is bounded by ``op_timeout_s``:
   compute, the all_reduce levels, the pair rounds (hostcheck.inside.sweep_plan), each rank's results into the
   store; rank 0 picks what to measure again, every rank does, and posts its last results;
3. rank 0 reads them all (a rank that never posts died: its last heartbeat says where) and prints the record.

Every rank prints one record line (launch.MARKER) and leaves with ``os._exit``; rank 0's record (every rank's
figures: tens of MiB at 16,384 nodes, past what is read back of a child's output) goes to the file the
orchestrator names (``record_path``, a new file of an unguessable name, created at the end), its line saying where: a process group that lost a peer
can hang in its destructor. The test faults (HOSTCHECK_SWEEP_TEST_FAULT, parsed by sweep_plan.parse_fault) slow
this node's sends or its compute; they exist for the tests and are carried into the record.

Why one module: it is one rank's life (connect, join, measure, post, retest, record) on one object's state, run as
``-m`` in the training Python where only torch, the standard library and sweep_plan may be imported.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import time
from typing import Any

from hostcheck.inside import sweep_plan as plan
from hostcheck.inside.workload.common import emit

PREFIX = "hostcheck-sweep"
#: How long rank 0 waits for results after its own phases ended, on top of the op timeout.
COLLECT_SLACK_S = 10.0
MIB = 1 << 20


class Abort(Exception):
    """The sweep cannot go on on this rank: ``kind`` says why (taken, unreachable, aborted, failed)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(1.0, float(seconds)))


class Worker:
    def __init__(self, args: dict[str, Any]) -> None:
        self.a = args
        self.node, self.local, self.gpus = int(args["node"]), int(args["local"]), int(args["gpus"])
        self.nodes = int(args["nodes"])
        self.backend = args["backend"]
        self.rules = plan.Rules.from_dict(args.get("rules") or {})
        self.fault = dict(args.get("fault") or {})
        self.sizes, self.timing = dict(args["sizes"]), dict(args["timing"])
        self.op_s = float(args["op_timeout_s"])
        self.first = self.node == 0 and self.local == 0
        self.phases: dict[str, float] = {}
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------------------------------ control plane

    def beat(self, phase: str) -> None:
        self.phase = phase
        if getattr(self, "rank", None) is not None:
            self.store.set(f"beat/{self.rank}", phase)

    def connect(self) -> None:
        from torch.distributed import PrefixStore, TCPStore

        hosting = self.first and not self.a.get("agent_store")
        try:
            tcp = TCPStore(
                self.a["master_addr"],
                int(self.a["master_port"]),
                None,
                hosting,
                _td(self.a["join_timeout_s"]),
                wait_for_workers=False,
            )
        except Exception as exc:  # torch raises RuntimeError and its own DistStoreError
            where = f"{self.a['master_addr']}:{self.a['master_port']}"
            if hosting:
                raise Abort(
                    "port",
                    f"MASTER_PORT {self.a['master_port']}: rank 0 cannot listen on it on this node (another sweep, or "
                    f"a job, may hold it: give another MASTER_PORT): {_last_line(exc)}",
                ) from None
            raise Abort(
                "unreachable", f"no sweep answered at {where} within the join timeout: {_last_line(exc)}"
            ) from None
        self.tcp = tcp
        self.store = PrefixStore(f"{PREFIX}/{self.a['run_id']}", tcp)
        if self.store.add(f"claim/{self.node}/{self.local}", 1) != 1:
            raise Abort(
                "taken",
                f"node rank {self.node} already joined a sweep at {self.a['master_addr']}:{self.a['master_port']} "
                "with this run id: another sweep is using this port",
            )

    def join(self, torch: Any) -> dict[str, Any]:
        if self.local == 0:
            me = {
                "node": self.node,
                "host": self.a.get("host") or socket.gethostname(),
                "slurm_node": self.a.get("slurm_node") or "",
                "gpus": self.gpus,
                "backend": self.backend,
                "torch": str(torch.__version__),
                "device": self.device_name(torch),
                "fault": self.fault,
                "world": self.nodes,
            }
            self.store.set(f"node/{self.node}", json.dumps(me))
            self.store.add("joined", 1)
        if self.first:
            self.store.set("plan", json.dumps(self.make_plan()))
        try:
            self.store.wait(["plan"], _td(float(self.a["join_timeout_s"]) + 30))
        except Exception as exc:
            raise Abort("unreachable", f"rank 0 published no plan: {_last_line(exc)}") from None
        got = json.loads(self.store.get("plan"))
        if got.get("abort"):
            raise Abort(str(got.get("kind") or "aborted"), str(got["abort"]))
        if self.node not in got["members"]:
            raise Abort(
                "aborted", f"node rank {self.node} joined after the join timeout: left out of this sweep"
            )
        return got

    def make_plan(self) -> dict[str, Any]:
        deadline = self.t0 + float(self.a["join_timeout_s"])
        while time.monotonic() < deadline and self.store.add("joined", 0) < self.nodes:
            time.sleep(0.2)
        info = {}
        for i in range(self.nodes):
            if self.store.check([f"node/{i}"]):
                info[i] = json.loads(self.store.get(f"node/{i}"))
        members = sorted(info)
        # A node told another WORLD_SIZE (a hand-set launch) joins a sweep it cannot finish: refuse it by name.
        other = [i for i in members if int(info[i].get("world", self.nodes)) != self.nodes]
        if other:
            said = ", ".join(f"node {i} ({info[i]['host']}) {info[i]['world']}" for i in other[:5])
            return {
                "abort": f"WORLD_SIZE differs between nodes: node 0 has {self.nodes}, {said}",
                "kind": "contract",
            }
        odd = [i for i in members if info[i]["backend"] != self.backend]
        if odd:
            said = ", ".join(f"node {i} ({info[i]['host']}) {info[i]['backend']}" for i in odd)
            return {"abort": f"the nodes disagree on the backend: node 0 runs {self.backend}, {said}"}
        offsets, at = {}, 0
        for i in members:
            offsets[i] = at
            at += int(info[i]["gpus"]) or 1
        return {"members": members, "offsets": offsets, "world": at, "info": info}

    def device_name(self, torch: Any) -> str:
        if self.backend == "nccl":
            return str(torch.cuda.get_device_name(self.local))
        return "cpu"

    # ------------------------------------------------------------------------------------------------ phases

    def run(self) -> int:
        self.phase = "start"
        self.rank: int | None = None
        try:
            import torch
            import torch.distributed as dist
        except Exception as exc:  # a broken training venv raises anything
            emit({"node": self.node, "local": self.local, "kind": "torch", "error": f"import torch: {exc}"})
            return 0
        self.torch, self.dist = torch, dist
        try:
            self.connect()
            got = self.join(torch)
            self.sweep(got)
        except Abort as exc:
            emit({"node": self.node, "local": self.local, "kind": exc.kind, "error": str(exc)})
        except Exception as exc:  # the store gone (rank 0's node died): torch raises its own errors
            said = (
                f"{self.phase}: the sweep's store stopped answering (rank 0's node gone?): {_last_line(exc)}"
            )
            emit({"node": self.node, "local": self.local, "kind": "aborted", "error": said})
        return 0

    def sweep(self, got: dict[str, Any]) -> None:
        """Measure, post the results, measure again what rank 0 asks, post again; rank 0 emits the record."""
        self.members = list(got["members"])
        self.offsets = {int(k): int(v) for k, v in got["offsets"].items()}
        self.info = {int(k): v for k, v in got["info"].items()}
        self.slots = {node: s for s, node in enumerate(self.members)}
        self.rank = self.offsets[self.node] + self.local
        self.world = int(got["world"])
        self.sched = plan.schedule(len(self.members), int(self.a["all_pairs_max"]))
        mine: dict[str, Any] = {
            "rank": self.rank,
            "node": self.node,
            "local": self.local,
            "pairs": [],
            "groups": [],
        }
        error = self.measure(mine)
        mine["error"] = error
        self.phase = "posting results"
        self.store.set(f"main/{self.rank}", json.dumps(mine))
        retest = self.retest_plan(mine) if self.first else None
        final: dict[str, Any] = {"rank": self.rank, "node": self.node, "local": self.local, "pairs": []}
        if error is None:
            final["error"] = self.run_retest(final)
        self.phase = "posting retest results"
        self.store.set(f"final/{self.rank}", json.dumps(final))
        if self.first:
            self.emit_record(self.record(retest or {}))
        else:
            emit({"node": self.node, "local": self.local, "rank": self.rank, "kind": "done", "error": error})

    def measure(self, mine: dict[str, Any]) -> str | None:
        torch, dist = self.torch, self.dist
        try:
            self.beat("init")
            t = time.monotonic()
            if self.backend == "nccl":
                torch.cuda.set_device(self.local)
                self.device = torch.device("cuda", self.local)
                dist.init_process_group(
                    "nccl",
                    store=self.pg_store(),
                    rank=self.rank,
                    world_size=self.world,
                    timeout=_td(self.op_s),
                    device_id=self.device,
                )
            else:
                self.device = torch.device("cpu")
                dist.init_process_group(
                    "gloo",
                    store=self.pg_store(),
                    rank=self.rank,
                    world_size=self.world,
                    timeout=_td(self.op_s),
                )
            self.phases["init"] = time.monotonic() - t
            for name, fn in (("compute", self.compute), ("allreduce", self.allreduce), ("pairs", self.pairs)):
                self.beat(name)
                t = time.monotonic()
                fn(mine)
                self.barrier()
                self.phases[name] = time.monotonic() - t
        except Exception as exc:  # a lost peer surfaces as any error of the backend
            return f"{self.phase}: {_last_line(exc)}"
        return None

    def pg_store(self) -> Any:
        from torch.distributed import PrefixStore

        return PrefixStore("pg", self.store)

    def barrier(self) -> None:
        if self.backend == "nccl":
            self.dist.barrier(device_ids=[self.local])
        else:
            self.dist.barrier()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def compute(self, mine: dict[str, Any]) -> None:
        """A fixed matmul, every rank at once: its rate in FLOP/s over batches longer than the scheduler's period
        (a CPU quota below what the rank uses shows in every batch), the best batch (see :meth:`timed`)."""
        torch, n = self.torch, int(self.sizes["matmul_n"])
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(n, n, generator=g, dtype=torch.float32).to(self.device, dtype)
        out = torch.empty_like(x)
        factor = float(self.fault.get("compute_factor", 1.0))

        def batch(steps: int) -> float:
            t = time.perf_counter()
            for _step in range(steps):
                torch.mm(x, x, out=out)
            self.sync()
            took = time.perf_counter() - t
            if factor > 1.0:  # the test fault: this node computes slower
                time.sleep(took * (factor - 1.0))
            return time.perf_counter() - t

        # Warm up, and size a batch from the fastest step seen: every batch then lasts batch_s or more, whatever
        # share of the CPU the rank gets (a first, cold step would size it too short to see a quota).
        steps, per = 1, float("inf")
        end = time.perf_counter() + float(self.timing["warm_s"])
        while per == float("inf") or time.perf_counter() < end:
            per = min(per, batch(steps) / steps)
            steps = max(1, int(float(self.timing["batch_s"]) / max(per, 1e-9)))
        times: list[float] = []
        end = time.perf_counter() + float(self.timing["compute_s"])
        while len(times) < 3 or (time.perf_counter() < end and len(times) < 200):
            times.append(batch(steps) / steps)
        step = min(times)
        mine["compute"] = {
            "flops_per_s": 2.0 * n**3 / step,
            "step_s": step,
            "batches": len(times),
            "steps": steps,
        }

    def ranks_of(self, node: int) -> list[int]:
        return [self.offsets[node] + g for g in range(int(self.info[node]["gpus"]) or 1)]

    def timed(self, op: Any, budget: float, group: Any = None, peer: int | None = None) -> tuple[float, int]:
        """Seconds per ``op``, the best of the timed ops, after one untimed op; the count of timed ops agreed by the
        members (a group's slowest first op, or the lower rank of a pair), so every member runs as many. The best,
        not the median: what else runs on a node (another job, a shared host's CPUs) only ever slows an op down,
        while a fault (a slow link, a GPU at low clocks, a CPU quota) slows every one of them."""
        t = time.perf_counter()
        op()
        first = time.perf_counter() - t
        count = max(2, min(int(self.timing["max_iters"]), int(budget / max(first, 1e-6))))
        agreed = self.torch.tensor([count], dtype=self.torch.int64, device=self.device)
        if peer is None:
            self.dist.all_reduce(agreed, op=self.dist.ReduceOp.MIN, group=group)
        elif self.rank < peer:
            self.dist.send(agreed, peer)
        else:
            self.dist.recv(agreed, peer)
        times = []
        for _op in range(int(agreed.item())):
            t = time.perf_counter()
            op()
            times.append(time.perf_counter() - t)
        return min(times), len(times)

    def allreduce(self, mine: dict[str, Any]) -> None:
        """Level 0 the whole group; level l its 2^l blocks of nodes, all at once, each in a group of its own."""
        nbytes = int(self.sizes["allreduce_bytes"])
        send_bps = float(self.fault.get("send_bps", 0.0))
        buf = self.torch.ones(max(1, nbytes // 4), dtype=self.torch.float32, device=self.device)
        my_slot = self.slots[self.node]
        for level, blocks in enumerate(self.sched.levels):
            self.beat(f"allreduce level {level}")
            index = next(i for i, b in enumerate(blocks) if my_slot in b)
            nodes = [self.members[s] for s in blocks[index]]
            ranks = [r for node in nodes for r in self.ranks_of(node)]
            group = None if level == 0 else self.new_group(ranks)

            throttle = 2.0 * (len(ranks) - 1) / len(ranks) * nbytes / send_bps if send_bps else 0.0

            def op(group: Any = group, throttle: float = throttle) -> None:
                time.sleep(throttle)  # the test fault: what a ring all_reduce sends, at the throttled rate
                self.dist.all_reduce(buf, group=group)
                self.sync()

            seconds, iters = self.timed(op, float(self.timing["allreduce_s"]), group=group)
            slowest = self.torch.tensor([seconds], dtype=self.torch.float64, device=self.device)
            self.dist.all_reduce(slowest, op=self.dist.ReduceOp.MAX, group=group)
            if self.rank == min(ranks):
                s = float(slowest.item())
                mine["groups"].append(
                    {
                        "level": level,
                        "index": index,
                        "nodes": nodes,
                        "bytes": nbytes,
                        "seconds": s,
                        "iters": iters,
                        "algbw": nbytes / s,
                    }
                )
            self.barrier()

    def new_group(self, ranks: list[int]) -> Any:
        try:  # only the members call it, each for its own block
            return self.dist.new_group(ranks, timeout=_td(self.op_s), use_local_synchronization=True)
        except TypeError:  # torch before 2.1: every rank creates every group, in the same order
            mine = None
            for blocks in self.sched.levels[1:]:
                for block in blocks:
                    rs = [r for s in block for r in self.ranks_of(self.members[s])]
                    g = self.dist.new_group(rs, timeout=_td(self.op_s))
                    if rs == ranks:
                        mine = g
            return mine

    def pairs(
        self, mine: dict[str, Any], rounds: list[list[plan.Pair]] | None = None, stage: str = "main"
    ) -> None:
        rounds = self.sched.pair_rounds if rounds is None else rounds
        my_slot = self.slots[self.node]
        for k, rnd in enumerate(rounds):
            self.beat(f"{stage} pairs round {k + 1} of {len(rounds)}")
            partner = next((b if a == my_slot else a for a, b in rnd if my_slot in (a, b)), None)
            if partner is not None:
                other = self.members[partner]
                rails = min(int(self.info[self.node]["gpus"]) or 1, int(self.info[other]["gpus"]) or 1)
                if self.local < rails:
                    got = self.pair(self.offsets[other] + self.local)
                    mine["pairs"].append(
                        {"round": k, "peer": other, "rail": self.local, "stage": stage, **got}
                    )
            self.barrier()

    def pair(self, peer: int) -> dict[str, Any]:
        """Latency (a ping-pong of one float, half the round trip) and bandwidth (both ends send at once: the
        slower direction sets the time) with ``peer``."""
        torch, dist = self.torch, self.dist
        lower = self.rank < peer
        send_bps = float(self.fault.get("send_bps", 0.0))
        one = torch.zeros(1, dtype=torch.float32, device=self.device)

        def ping() -> None:
            if lower:
                dist.send(one, peer)
                dist.recv(one, peer)
            else:
                dist.recv(one, peer)
                dist.send(one, peer)
            self.sync()

        for _warm in range(3):
            ping()
        rtts = []
        for _ping in range(int(self.timing["latency_iters"])):
            t = time.perf_counter()
            ping()
            rtts.append(time.perf_counter() - t)
        nbytes = int(self.sizes["pair_bytes"])
        out = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=self.device)
        into = torch.empty_like(out)

        def exchange() -> None:
            if send_bps:  # the test fault: this node's sends are throttled
                time.sleep(nbytes / send_bps)
            ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            self.sync()

        seconds, iters = self.timed(exchange, float(self.timing["pair_s"]), peer=peer)
        return {"latency_s": min(rtts) / 2, "bytes_per_s": nbytes / seconds, "iters": iters, "bytes": nbytes}

    # ------------------------------------------------------------------------------------------------ retest

    def collect(self, stage: str, ranks: list[int], wait_s: float) -> dict[int, dict[str, Any]]:
        """The ``stage`` results of ``ranks`` that arrive within ``wait_s``."""
        keys = [f"{stage}/{r}" for r in ranks]
        with contextlib.suppress(Exception):  # a timeout: some never came
            self.store.wait(keys, _td(wait_s))
        return {r: json.loads(self.store.get(k)) for r, k in zip(ranks, keys) if self.store.check([k])}

    def retest_plan(self, mine: dict[str, Any]) -> dict[str, Any]:
        """Rank 0: every rank's main results, then what to measure again, published as ``retest``."""
        # A rank still blocked in an op with a lost peer posts at its op timeout at the latest: silent after that and
        # the slack, it is gone.
        self.main = self.collect("main", list(range(self.world)), self.op_s + COLLECT_SLACK_S)
        failed = {r: m["error"] for r, m in self.main.items() if m.get("error")}
        missing = [r for r in range(self.world) if r not in self.main]
        out: dict[str, Any] = {"rounds": []}
        if failed or missing:
            out["skip"] = "a rank failed or stopped answering: nothing measured again"
        else:
            bw, lat, _counts = plan.best_repeats(
                plan.node_pairs(self.main.values(), "main"), self.slots.__getitem__
            )
            groups = [g for m in self.main.values() for g in m["groups"]]
            pointed, _slow = plan.bisected(groups, self.rules)
            suspects = {self.slots[n] for n in pointed if n in self.slots}
            again = plan.retest(len(self.members), bw, lat, suspects, self.sched.mode, self.rules)
            rounds = plan.pack(again)
            limit = int(self.a.get("retest_rounds_max", 8))
            if len(rounds) > limit:
                out["cut"] = f"{len(rounds)} retest rounds, {limit} run"
            out["rounds"] = rounds[:limit]
        self.store.set("retest", json.dumps(out))
        return out

    def run_retest(self, final: dict[str, Any]) -> str | None:
        try:
            self.beat("retest plan")
            self.store.wait(["retest"], _td(2 * self.op_s + COLLECT_SLACK_S))
            got = json.loads(self.store.get("retest"))
            rounds = [[(int(a), int(b)) for a, b in r] for r in got.get("rounds") or []]
            t = time.monotonic()
            self.pairs(final, rounds, "retest")
            self.phases["retest"] = time.monotonic() - t
        except Exception as exc:
            return f"{self.phase}: {_last_line(exc)}"
        return None

    # ------------------------------------------------------------------------------------------------ record

    def emit_record(self, record: dict[str, Any]) -> None:
        """Rank 0's record into ``record_path`` (created here, never over a file), or on its line without one."""
        path = self.a.get("record_path")
        if not path:
            emit({"record": record})
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f, separators=(",", ":"))
        except OSError as exc:
            emit({"node": 0, "local": 0, "kind": "record", "error": f"writing its record to {path}: {exc}"})
            return
        emit({"record_file": path})

    def record(self, retest: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's record: every node and rank, what each measured, who failed and who was never heard."""
        main = getattr(self, "main", {})
        ok = [r for r, m in main.items() if not m.get("error")]
        final = self.collect("final", ok, self.op_s + COLLECT_SLACK_S) if ok else {}
        owner = {r: node for node in self.members for r in self.ranks_of(node)}
        nodes = []
        for i in range(self.nodes):
            row: dict[str, Any] = {"node": i, "state": "measured"}
            if i not in self.info:
                row.update(state="missing", host=_expected(self.a, i), gpus=0, ranks=[])
                nodes.append(row)
                continue
            info = self.info[i]
            ranks = self.ranks_of(i)
            row.update(host=info["host"], slurm_node=info["slurm_node"], gpus=info["gpus"], ranks=ranks)
            row.update(device=info["device"], torch=info["torch"], fault=info.get("fault") or {})
            silent = [r for r in ranks if r not in main]
            errors = [main[r]["error"] for r in ranks if r in main and main[r].get("error")]
            late = [r for r in ranks if r in main and not main[r].get("error") and r not in final]
            if silent:
                beats = [
                    self.store.get(f"beat/{r}").decode() for r in silent if self.store.check([f"beat/{r}"])
                ]
                row.update(state="died", last_phase=beats[0] if beats else "before init")
            elif errors:
                row.update(state="failed", error=errors[0])
            elif late:
                row.update(state="died", last_phase="retest")
            nodes.append(row)
        pairs = plan.node_pairs(main.values(), "main") + plan.node_pairs(final.values(), "retest")
        return {
            "sweep": 1,
            "backend": self.backend,
            "run_id": str(self.a["run_id"]),
            "world_ranks": self.world,
            "mode": self.sched.mode,
            "rounds": {**self.sched.rounds, "retest": len(retest.get("rounds") or [])},
            "retest_note": retest.get("skip") or retest.get("cut") or "",
            "sizes": self.sizes,
            "timing": self.timing,
            "rules": self.rules.to_dict(),
            "nodes": nodes,
            "compute": [
                {"rank": r, "node": owner[r], "local": m["local"], **m["compute"]}
                for r, m in sorted(main.items())
                if m.get("compute")
            ],
            "pairs": pairs,
            "groups": sorted(
                (g for m in main.values() for g in m["groups"]), key=lambda g: (g["level"], g["index"])
            ),
            "errors": [
                {"rank": r, "node": owner[r], "error": m["error"]}
                for r, m in sorted(main.items())
                if m.get("error")
            ]
            + [
                {"rank": r, "node": owner[r], "error": f["error"]}
                for r, f in sorted(final.items())
                if f.get("error")
            ],
            "phases_s": {k: round(v, 3) for k, v in self.phases.items()},
            "wall_s": round(time.monotonic() - self.t0, 3),
        }


def _expected(args: dict[str, Any], node: int) -> str:
    hosts = args.get("expected_hosts") or []
    return str(hosts[node]) if node < len(hosts) else ""


def _last_line(exc: BaseException) -> str:
    said = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = said[-1] if said else type(exc).__name__
    return text[:300]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = json.loads(argv[argv.index("--json-args") + 1])
    if args.get("backend") == "nccl":
        # A peer lost mid-collective raises here instead of tearing the process down from NCCL's watchdog.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    code = Worker(args).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
