"""One sweep rank (hostcheck.inside.sweep.Worker) against a store that fails as torch's TCPStore fails: when rank 0's
node dies, the store it kept is gone and every get/set of the others raises (torch raises DistNetworkError, a
RuntimeError: "Connection reset by peer", torch/csrc/distributed/c10d/TCPStore.cpp); and rank 0's plan when the
nodes were started with different WORLD_SIZEs. The store is a dict; no process group is made."""

from __future__ import annotations

import json

import pytest

from hostcheck.child.launch import MARKER
from hostcheck.inside import sweep

pytest.importorskip("torch")


class Store:
    """torch's Store calls the worker makes, over a dict; ``dead`` makes every call raise as a lost TCPStore does."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.dead = False

    def _alive(self) -> None:
        if self.dead:
            raise RuntimeError("Connection reset by peer")

    def set(self, key: str, value: str) -> None:
        self._alive()
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        self._alive()
        return self.kv[key]

    def add(self, key: str, n: int) -> int:
        self._alive()
        value = int(self.kv.get(key, b"0")) + n
        self.kv[key] = str(value).encode()
        return value

    def check(self, keys: list[str]) -> bool:
        self._alive()
        return all(k in self.kv for k in keys)

    def wait(self, keys: list[str], _timeout: object = None) -> None:
        self._alive()
        if not self.check(keys):
            raise RuntimeError("Socket Timeout")


def _args(node: int, nodes: int = 2) -> dict:
    return {
        "node": node,
        "nodes": nodes,
        "local": 0,
        "gpus": 0,
        "backend": "gloo",
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "run_id": "env",
        "join_timeout_s": 1,
        "op_timeout_s": 1,
        "sizes": {},
        "timing": {},
        "all_pairs_max": 64,
        "host": f"n{node}",
    }


def _records(out: str) -> list[dict]:
    return [json.loads(line[len(MARKER) :]) for line in out.splitlines() if line.startswith(MARKER)]


def _rank1(monkeypatch, store: Store, dies: bool) -> sweep.Worker:
    """Node 1's rank, its store connected and the plan published; ``dies``: rank 0's node goes while it measures."""
    w = sweep.Worker(_args(1))
    got = {
        "members": [0, 1],
        "offsets": {"0": 0, "1": 1},
        "info": {"0": {"gpus": 0}, "1": {"gpus": 0}},
        "world": 2,
    }

    def connect() -> None:
        w.store = store

    def join(_torch: object) -> dict:
        return got

    def measure(_mine: dict) -> None:
        store.dead = dies

    monkeypatch.setattr(w, "connect", connect)
    monkeypatch.setattr(w, "join", join)
    monkeypatch.setattr(w, "measure", measure)
    return w


@pytest.mark.parametrize("dies", [True, False])
def test_a_rank_whose_store_died_mid_sweep_ends_with_a_record_not_a_traceback(monkeypatch, capsys, dies):
    store = Store()
    store.set("retest", json.dumps({"rounds": []}))  # rank 0's retest plan: nothing to measure again
    assert _rank1(monkeypatch, store, dies).run() == 0
    out = capsys.readouterr()
    (rec,) = _records(out.out)
    assert "Traceback" not in out.err
    if dies:
        assert (
            rec["kind"] == "aborted"
            and "posting results: the sweep's store stopped answering" in rec["error"]
        )
    else:
        assert rec["kind"] == "done" and rec["error"] is None
        assert store.check(["main/1", "final/1"])


def test_nodes_started_with_different_world_sizes_are_refused_naming_world_size():
    store = Store()
    for node, world in ((0, 2), (1, 3)):
        store.set(
            f"node/{node}",
            json.dumps({"node": node, "host": f"n{node}", "gpus": 0, "backend": "gloo", "world": world}),
        )
        store.add("joined", 1)
    w = sweep.Worker(_args(0))
    w.store = store
    got = w.make_plan()
    assert got["kind"] == "contract" and got["abort"].startswith(
        "WORLD_SIZE differs between nodes: node 0 has 2"
    )
    assert "node 1 (n1) 3" in got["abort"]
    # The same nodes agreeing on WORLD_SIZE: both swept.
    store.set("node/1", json.dumps({"node": 1, "host": "n1", "gpus": 0, "backend": "gloo", "world": 2}))
    assert w.make_plan()["members"] == [0, 1]


# --------------------------------------------------------------------------------------------- rank 0's record


def test_rank_0s_record_goes_to_the_named_file_and_back_through_the_bounded_reader(
    tmp_path, monkeypatch, capsys
):
    from hostcheck.child.launch import ProbeRun
    from hostcheck.sweep import cli

    # A record larger than what is read back of a child's output (RECORDS_CAP, 8 MiB): 16,384 nodes' worth of rows.
    row = {"flops_per_s": 7.1e14, "step_s": 1.55e-3, "batches": 20, "steps": 32}
    record = {
        "sweep": 1,
        "compute": [{"rank": r, "node": r // 8, "local": r % 8, **row} for r in range(131072)],
    }
    w = sweep.Worker({**_args(0), "record_path": str(tmp_path / "record.json")})
    w.emit_record(record)
    (said,) = _records(capsys.readouterr().out)
    assert said == {"record_file": str(tmp_path / "record.json")}
    assert (tmp_path / "record.json").stat().st_size > 8 << 20
    got, _kinds, problems = cli._said([ProbeRun("sweep", (said,))])
    assert got == record and problems == []
    # Past the bound: refused, the bound named, exit 2 (no report rather than a partial one).
    monkeypatch.setattr(cli, "MAX_RECORD_BYTES", 1 << 20)
    got, kinds, problems = cli._said([ProbeRun("sweep", (said,))])
    assert got is None and kinds == ["record"] and "MAX_RECORD_BYTES, 1048576 bytes" in problems[0]


def test_a_record_file_that_is_a_link_is_refused(tmp_path):
    from hostcheck.child.launch import ProbeRun
    from hostcheck.sweep import cli

    (tmp_path / "record.json").symlink_to("/dev/zero")
    got, kinds, problems = cli._said([ProbeRun("sweep", ({"record_file": str(tmp_path / "record.json")},))])
    assert got is None and kinds == ["record"] and "symbolic link" in problems[0]


def test_the_record_is_never_written_over_a_file_already_there(tmp_path, capsys):
    (tmp_path / "record.json").write_text("precious")
    sweep.Worker({**_args(0), "record_path": str(tmp_path / "record.json")}).emit_record({"sweep": 1})
    (said,) = _records(capsys.readouterr().out)
    assert said["kind"] == "record" and "File exists" in said["error"]
    assert (tmp_path / "record.json").read_text() == "precious"
