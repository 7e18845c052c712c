"""Hostile local facts: wrong types, special files, loops, giants. Each once crashed, hung or misled a check."""

from __future__ import annotations

import json
import os
import threading

import pytest

from hostcheck import command
from hostcheck.checks import all_checks
from hostcheck.gather import Options, gather
from hostcheck.gather.facts import MAX_FACT_BYTES, gather_facts
from hostcheck.registry import Status, run_check

CHECKS = {c.id: c for c in all_checks()}


def _write(d, role, data):
    (d / f"{role}.fact").write_text(json.dumps(data))


def _with_timeout(fn, seconds=10):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked"
    return out[0]


@pytest.mark.parametrize(
    ("role", "key", "value"),
    [
        ("gpunode_tuning", "env_file", 1),  # once: open(1), which closed hostcheck's own stdout
        ("gpunode_tuning", "env_file", "relative/training.env"),
        ("gpunode_tuning", "services_disabled", 5),  # once: a TypeError and no report at all
        ("gpunode_tuning", "venv", 12),  # once: the torch gatherer died and every torch check said SKIP
        ("gpunode_tuning", "omp_num_threads", -2),
        ("gpunode_driver", "expected_gpu_count", 1e400),  # once: OverflowError in gpu.E002
        ("gpunode_driver", "expected_gpu_count", "-4"),  # once: taken as an expectation
        ("gpunode_driver", "expected_gpu_count", True),
        ("gpunode_driver", "version", {"x": 1}),
        ("gpunode_pytorch", "venv", ["/opt"]),
    ],
)
def test_a_wrong_value_is_dropped_and_named_while_the_rest_counts(tmp_path, role, key, value):
    _write(tmp_path, role, {key: value, "keep": "me"})
    raw = (tmp_path / f"{role}.fact").read_text()
    f = gather_facts(str(tmp_path))
    assert not f.has(role, key) and f.get(role, "keep") == "me"
    assert len(f.invalid) == 1 and f"{role}.fact: {key} is " in f.invalid[0]
    snap = gather(Options(facts_dir=str(tmp_path), python="/nonexistent/python"), {"facts"})
    r = run_check(CHECKS["system.E004"], snap)
    assert r.status == Status.WARN and f"{role}.fact: {key}" in r.message
    assert json.loads(raw)  # the file itself is left as it was
    assert (tmp_path / f"{role}.fact").read_text() == raw


def test_values_the_roles_write_pass(tmp_path):
    _write(
        tmp_path,
        "gpunode_tuning",
        {
            "env_file": "/etc/gpunode/training.env",
            "venv": "/opt/gpunode/venv",
            "services_disabled": ["irqbalance"],
            "shm_size_bytes": 68719476736,
            "omp_num_threads": "8",
            "numa_nodes": 2,
            "gpu_numa": {"0000:18:00.0": 0},
            "limits": {"memlock": "unlimited"},
            "allocator": "none",
            "malloc_conf": "",
            "pillow_simd": False,
            "pillow_simd_features": [],
            "cpu_governor": "",
            "thp": "madvise",
        },
    )
    _write(
        tmp_path,
        "gpunode_driver",
        {"version": "580.95.05", "expected_gpu_count": 8, "fabricmanager": "false"},
    )
    _write(tmp_path, "gpunode_pytorch", {"venv": "/opt/gpunode/venv", "torch": "2.13.0"})
    _write(tmp_path, "gpunode_cuda", {"venv": ""})
    f = gather_facts(str(tmp_path))
    assert f.invalid == () and f.errors == {} and len(f.roles) == 4


def test_the_env_file_fact_never_touches_our_own_descriptors(tmp_path, capsys):
    _write(tmp_path, "gpunode_tuning", {"env_file": 1})
    assert command.main(["--json", "--only", "tuning.E011,system.E004", "--facts-dir", str(tmp_path)]) in (
        0,
        1,
    )
    doc = json.loads(capsys.readouterr().out)  # stdout still open, the report whole
    e004 = next(c for c in doc["checks"] if c["id"] == "system.E004")
    assert "env_file is 1" in e004["message"]
    os.fstat(1)


def test_a_fifo_in_place_of_a_fact_is_reported_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "gpunode_tuning.fact")
    f = _with_timeout(lambda: gather_facts(str(tmp_path)))
    assert "not a regular file" in f.errors["gpunode_tuning"].reason


def test_a_symlink_loop_is_a_loop_not_a_missing_role(tmp_path):
    (tmp_path / "gpunode_driver.fact").symlink_to(tmp_path / "gpunode_driver.fact")
    (tmp_path / "gpunode_cuda.fact").symlink_to(tmp_path / "nowhere")
    f = gather_facts(str(tmp_path))
    assert "symbolic link loop" in f.errors["gpunode_driver"].reason
    assert "broken symbolic link" in f.errors["gpunode_cuda"].reason
    snap = gather(Options(facts_dir=str(tmp_path)), {"facts"})
    r = run_check(CHECKS["system.E004"], snap)
    assert r.status == Status.WARN and "loop" in r.message and "not provisioned" not in r.message


def test_a_giant_fact_says_its_size_not_that_it_is_not_json(tmp_path):
    (tmp_path / "gpunode_tuning.fact").write_text(json.dumps({"pad": "x" * (MAX_FACT_BYTES + 10)}))
    f = gather_facts(str(tmp_path))
    assert (
        "bytes" in f.errors["gpunode_tuning"].reason and "not JSON" not in f.errors["gpunode_tuning"].reason
    )


def test_a_symlink_to_a_good_fact_is_read(tmp_path):
    (tmp_path / "real.json").write_text(json.dumps({"expected_gpu_count": 4}))
    (tmp_path / "gpunode_driver.fact").symlink_to(tmp_path / "real.json")
    assert gather_facts(str(tmp_path)).get("gpunode_driver", "expected_gpu_count") == 4


def test_a_torch_gatherer_that_dies_is_an_error_never_a_neutral_skip(tmp_path, monkeypatch):
    import hostcheck.gather as g

    def boom(explicit, facts):
        raise RuntimeError("chooser exploded")

    monkeypatch.setattr("hostcheck.gather.torchinfo.choose_python", boom)
    snap = g.gather(Options(facts_dir=str(tmp_path), torch_timeout_s=5), {"torch", "facts"})
    assert snap.torch is not None and "chooser exploded" in snap.torch.error.reason
    r = run_check(CHECKS["torch.E001"], snap)
    assert r.status == Status.ERROR and "chooser exploded" in r.message
