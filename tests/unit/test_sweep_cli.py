"""``hostcheck sweep`` for real: several node processes on this machine, each started as a launcher starts it (torch's
contract in its environment), with gloo on loopback and the CPU torch of this venv. One node's sends are throttled
and another's compute slowed by the test fault (HOSTCHECK_SWEEP_TEST_FAULT, planted on that node alone): rank 0
must name those two and no other, and drain neither through a fake scontrol (a planted fault drains nobody;
test_sweep_judge drives the drain of measured findings). Then the faults a sweep must end cleanly
on: a node that never joins, a node killed mid-sweep, a second sweep on the same port.

The nodes share this machine's two cores (and, while the suite runs, with other tests): the loopback's rates and
the ranks' compute swing far more than a fabric's, so the tolerances are widened through --config, as a site sets
them (named below 30% of the peers); the planted faults are far past them (a send rate of 8 MB/s against hundreds,
a tenth of the compute).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_attacks import _kill, _ticks_now, carriers

from hostcheck.child.launch import free_port

REPO = Path(__file__).resolve().parents[2]
MARKER_VAR = "HOSTCHECK_ATTACK"
pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch.distributed"], capture_output=True).returncode != 0,
    reason="this Python has no torch",
)
LOOSE = (
    "[thresholds]\nsweep_link_tolerance = 0.7\nsweep_compute_tolerance = 0.7\nsweep_latency_factor = 20.0\n"
)
FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> {log}
case "$1" in
  --json) exit 1 ;;
  -o) echo "NodeName=$4 Arch=x86_64 State=IDLE ThreadsPerCore=1" ;;
esac
"""


class Nodes:
    """Node processes started as a launcher starts them, each with the run's marker in its environment."""

    def __init__(self, tmp: Path, world: int, port: int | None = None) -> None:
        self.tmp, self.world = tmp, world
        self.port = port or free_port()
        self.marker = uuid.uuid4().hex
        self.since = _ticks_now()
        self.procs: dict[int, subprocess.Popen] = {}
        (tmp / "facts").mkdir(exist_ok=True)
        (tmp / "sweep.toml").write_text(LOOSE)

    def start(
        self, rank: int, *extra: str, fault: str = "", env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        environ = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1",
            MARKER_VAR: self.marker,
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port),
            "LOCAL_RANK": "0",
            "SLURMD_NODENAME": f"n{rank}",
            "HOSTCHECK_SWEEP_TEST_FAULT": fault,
            **(env or {}),
        }
        for k in (
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_USE_AGENT_STORE",
            "SLURM_PROCID",
            "PYTEST_CURRENT_TEST",
        ):
            environ.pop(k, None)
        argv = [sys.executable, "-m", "hostcheck", "sweep", "--python", sys.executable, "--device", "cpu"]
        argv += ["--facts-dir", str(self.tmp / "facts"), "--env-file", str(self.tmp / "none.env")]
        argv += [
            "--config",
            str(self.tmp / "sweep.toml"),
            "--json",
            str(self.tmp / f"report{rank}.json"),
            *extra,
        ]
        self.procs[rank] = p = subprocess.Popen(
            argv,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return p

    def wait(self, timeout: float = 240.0) -> dict[int, tuple[int, str, str]]:
        out = {}
        deadline = time.monotonic() + timeout
        for rank, p in sorted(self.procs.items()):
            try:
                stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"node {rank} still running after {timeout:g} s: a sweep must end on its own")
            out[rank] = (p.returncode, stdout, stderr)
        return out

    def kill(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
        _kill([pid for pid, _ in carriers(self.marker, self.since)])

    def left(self) -> list[tuple[int, str]]:
        deadline = time.monotonic() + 10
        while (found := carriers(self.marker, self.since)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return found

    def report(self) -> dict:
        return json.loads((self.tmp / "report0.json").read_text())


@pytest.fixture
def nodes(tmp_path):
    made: list[Nodes] = []

    def make(world: int, port: int | None = None) -> Nodes:
        made.append(Nodes(tmp_path, world, port))
        return made[-1]

    yield make
    for n in made:
        n.kill()


def _named(report: dict) -> list[tuple[str, list[int]]]:
    return sorted((f["id"], f["nodes"]) for f in report["suspects"])


def test_the_throttled_node_and_the_slow_node_are_named_and_not_drained_for_a_test(nodes, tmp_path):
    log = tmp_path / "scontrol.log"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(FAKE_SCONTROL.format(log=log))
    fake.chmod(0o755)
    path = {"PATH": f"{fake.parent}:{os.environ['PATH']}"}
    n = nodes(4)
    faults = {1: "compute_factor=10", 2: "send_bps=8e6"}
    for rank in range(4):
        # A node carrying the test fault refuses --slurm-drain itself: rank 0 holds it.
        drain = () if rank in faults else ("--slurm-drain",)
        n.start(rank, *drain, "--op-timeout", "60", fault=faults.get(rank, ""), env=path)
    got = n.wait()
    assert [got[r][0] for r in range(4)] == [1, 0, 0, 0], got
    report = n.report()
    assert _named(report) == [("sweep.S001", [1]), ("sweep.S002", [2])], report["suspects"]
    assert report["launcher"] == "env" and report["backend"] == "gloo" and report["rounds"]["pairs"] == 3
    # Each finding says the fault was a test's, planted on that node.
    assert all("a test fault was planted on this node" in " ".join(f["evidence"]) for f in report["suspects"])
    assert not log.exists() or "update" not in log.read_text()
    assert "a test fault was planted (HOSTCHECK_SWEEP_TEST_FAULT): nothing drained" in got[0][2]
    assert "NAMED: " in got[0][1] and "measured; rank 0 at 127.0.0.1 writes the report" in got[3][1]
    assert n.left() == []


def _listening(port: int, deadline: float) -> None:
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.2)


def test_a_node_that_never_joins_is_named_and_a_second_sweep_on_its_port_fails(nodes, tmp_path):
    n = nodes(3)
    for rank in range(2):  # node 2 never starts
        n.start(rank, "--join-timeout", "15", "--op-timeout", "30")
    _listening(n.port, time.monotonic() + 120)
    (tmp_path / "second").mkdir()
    second = Nodes(tmp_path / "second", 3, n.port)
    try:
        second.start(0)
        rc, _out, err = second.wait(timeout=60)[0]
        assert rc == 2 and f"MASTER_PORT {n.port}: in use on this node (another sweep" in err, err
        assert second.left() == []
    finally:
        second.kill()
    got = n.wait(timeout=150)
    assert [got[r][0] for r in range(2)] == [1, 0], got
    report = n.report()
    (gone,) = report["suspects"]
    assert (gone["id"], gone["nodes"]) == ("sweep.S004", [2])
    assert "never joined the sweep within the join timeout" in gone["message"]
    # Two nodes measured: too few peers, said so, nothing else named.
    assert report["verdict"]["judged"] == [] and any("not judged" in x for x in report["notes"])
    assert n.left() == []


def test_a_rank_already_taken_at_the_port_is_refused(nodes):
    """A second sweep's node whose rank a sweep at that port already has (the same run id: plain env launches)."""
    import datetime

    from torch.distributed import TCPStore

    n = nodes(2)
    store = TCPStore("127.0.0.1", n.port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    store.add("hostcheck-sweep/env/claim/1/0", 1)
    n.start(1, "--join-timeout", "20")
    rc, _out, err = n.wait(timeout=120)[1]
    assert rc == 2 and "node rank 1 already joined a sweep at 127.0.0.1" in err, err
    assert n.left() == []


def test_a_node_killed_mid_sweep_is_named_and_leaves_nothing_behind(nodes):
    n = nodes(3)
    for rank in range(3):
        # Node 1's throttled sends stretch the rounds: the kill lands while the ranks measure.
        n.start(rank, "--join-timeout", "30", "--op-timeout", "10", fault="send_bps=2e6" if rank == 1 else "")
    victim = n.procs[2]
    deadline = time.monotonic() + 120
    while not [
        pid
        for pid, cmd in carriers(n.marker, n.since)
        if "hostcheck.inside" in cmd and _child_of(pid, victim.pid)
    ]:
        assert time.monotonic() < deadline and victim.poll() is None, "node 2's rank never started"
        time.sleep(0.2)
    time.sleep(8)
    victim.send_signal(signal.SIGKILL)
    got = n.wait(timeout=180)
    assert got[2][0] == -signal.SIGKILL
    assert got[0][0] == 1 and got[1][0] in (0, 1), got
    gone = [f for f in n.report()["suspects"] if f["id"] == "sweep.S004"]
    assert [f["nodes"] for f in gone] == [[2]], n.report()["suspects"]
    # Nobody hung: the killed node's rank went with it (the reaper), the others at their op timeout.
    assert n.left() == []


def _child_of(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False
