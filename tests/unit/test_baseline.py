"""A baseline per node type: ``hostcheck baseline`` records a known-good node, baseline.E001-E007 compare a node with it.

The node is a copy of tests/unit/fixtures/hosttree/inventory (its /proc and /sys, transcribed from the kernel's
documents) with the fake NVML's eight H100s; one fault is planted at a time and must be caught by exactly its check,
and the healthy node, recorded and then checked, passes every baseline check. The section's TOML is written by
hostcheck's own small emitter and read back by tomllib: what is written reads back equal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import hostcheck_scenarios as S
import pytest
import tomllib

from hostcheck.baseline.record import section
from hostcheck.baseline.toml import TomlError, emit, loads, splice
from hostcheck.checks import all_checks
from hostcheck.config import Config, ConfigError, parse
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.base import NO_PERMISSION, Unavailable
from hostcheck.gather.inventory import (
    CpuInfo,
    gather_inventory,
    parse_cpuinfo,
    parse_link_speed,
    parse_meminfo,
)
from hostcheck.gather.nvml import gather_nvml
from hostcheck.gather.rdma import parse_rate
from hostcheck.registry import Status

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
TREE = FIXTURES / "hosttree" / "inventory"
IDS = {f"baseline.E00{i}" for i in range(1, 8)}
NOT_OK = (Status.WARN, Status.FAIL, Status.ERROR)
CHECKS = [c for c in all_checks() if c.category == "baseline"]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(TREE, root)
    return root


def nvml(**gpus):
    """The fake NVML's node with GPU ``i`` changed as h100_gpu takes it: nvml(g3={"vbios": "x"})."""
    changed = {int(k[1:]): v for k, v in gpus.items()}
    return gather_nvml(
        nvml=S.FakeNvml(gpus=[S.h100_gpu(i, **changed.get(i, {})) for i in range(8)]), proc_name=str
    )


def record(root: Path) -> Config:
    """``hostcheck baseline`` on the healthy node, as the configuration reads it back."""
    body, _ = section(gather_inventory(str(root), nvml()), "h100-node-01", "2026-11-26T12:00:00Z")
    return parse(tomllib.loads(emit(body)), "hostcheck.toml")


def judge(root: Path, cfg: Config, nv=None):
    snap = dataclasses.replace(
        S.make_snapshot(options=Options(config=cfg)), inventory=gather_inventory(str(root), nv or nvml())
    )
    results, _ = evaluate(snap, CHECKS)
    return {r.id: r for r in results}


def not_ok(results) -> dict[str, Status]:
    return {i: r.status for i, r in results.items() if r.status in NOT_OK}


def put(root: Path, rel: str, text: str) -> None:
    (root / rel).write_text(text)


# --- parsing --------------------------------------------------------------------------------------------------


def test_cpuinfo_is_counted_as_nhc_counts_it():
    text = (TREE / "proc/cpuinfo").read_text()
    assert parse_cpuinfo(text) == CpuInfo("Intel(R) Xeon(R) Platinum 8480+", 2, 8, 16)
    # Without topology fields (a VM, another architecture): every processor its own socket and core.
    assert parse_cpuinfo("processor : 0\n\nprocessor : 1\n") == CpuInfo("", 2, 2, 2)
    assert parse_cpuinfo("garbage") is None


def test_rates_speeds_and_memory_parse_from_the_kernels_words():
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0 and parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("Unknown") is None
    assert parse_link_speed("32.0 GT/s PCIe") == 32.0 and parse_link_speed("8 GT/s") == 8.0
    assert parse_link_speed("Unknown") is None and parse_link_speed(None) is None
    assert parse_meminfo("MemTotal:       2113311792 kB\n") == 2113311792 * 1024
    assert parse_meminfo("MemFree: 1 kB\n") is None


def test_the_inventory_is_read_under_the_host_root(tree):
    inv = gather_inventory(str(tree), nvml())
    assert inv.memory_bytes == 2113311792 * 1024 and inv.numa_cpus == ("0-3,8-11", "4-7,12-15")
    assert [(d.name, d.size_bytes) for d in inv.nvme] == [
        ("nvme0", 7501476528 * 512),
        ("nvme1", 7501476528 * 512),
    ]
    assert inv.nvme[0].model == "SAMSUNG MZQL23T8HCLS-00A07"  # sysfs pads the model with spaces
    # lo has no device; the IPoIB ports (type 32) are counted as their RDMA ports.
    assert [(p.name, p.rate) for p in inv.nics] == [("eth0", 100000.0)]
    assert [(p.name, p.rate) for p in inv.rdma] == [("mlx5_0:1", 400.0), ("mlx5_1:1", 400.0)]
    kinds = [(link.kind, link.width) for link in inv.links]
    assert kinds.count(("GPU", 16)) == 8 and kinds.count(("NIC", 16)) == 3 and len(kinds) == 11  # no NVSwitch
    assert len(inv.gpus) == 8 and inv.gpus[0].vbios == "96.00.99.00.01"


# --- the healthy node, and the planted faults --------------------------------------------------------------------


def test_the_recorded_node_passes_every_baseline_check(tree):
    r = judge(tree, record(tree))
    assert {i: res.status for i, res in r.items()} == dict.fromkeys(IDS, Status.PASS), {
        i: res.message for i, res in r.items()
    }
    assert "within 5%" in r["baseline.E002"].message


def _drop_nvme(t: Path) -> None:
    shutil.rmtree(t / "sys/class/nvme/nvme1")


def _memory_short(pct: float):
    def plant(t: Path) -> None:
        kb = int(2113311792 * (1 - pct / 100))
        put(t, "proc/meminfo", f"MemTotal:       {kb} kB\n")

    return plant


FAULTS = {
    # fault: (plant in the tree, NVML changes, the one check that catches it, its status)
    "missing-nvme-drive": (_drop_nvme, {}, "baseline.E003", Status.FAIL),
    "memory-6pct-short": (_memory_short(6), {}, "baseline.E002", Status.FAIL),
    "gpu-on-another-vbios": (None, {"g3": {"vbios": "96.00.AA.00.01"}}, "baseline.E005", Status.WARN),
    "gpu-link-x8": (
        lambda t: put(t, "sys/bus/pci/devices/0000:5d:00.0/current_link_width", "8\n"),
        {},
        "baseline.E006",
        Status.FAIL,
    ),
    "ethernet-port-at-25g": (
        lambda t: put(t, "sys/class/net/eth0/speed", "25000\n"),
        {},
        "baseline.E004",
        Status.FAIL,
    ),
    "one-socket-of-cores-off": (
        lambda t: put(t, "proc/cpuinfo", (TREE / "proc/cpuinfo").read_text().split("processor\t: 12")[0]),
        {},
        "baseline.E001",
        Status.FAIL,
    ),
    "numa-layout-changed": (
        lambda t: shutil.rmtree(t / "sys/devices/system/node/node1"),
        {},
        "baseline.E007",
        Status.WARN,
    ),
    "gpu-missing": (None, {}, "baseline.E005", Status.FAIL),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_planted_fault_is_caught_by_exactly_its_check(tree, fault):
    plant, gpus, check_id, status = FAULTS[fault]
    cfg = record(tree)
    if plant:
        plant(tree)
    nv = nvml(**gpus)
    if fault == "gpu-missing":
        nv = gather_nvml(nvml=S.FakeNvml(gpus=[S.h100_gpu(i) for i in range(7)]), proc_name=str)
    r = judge(tree, cfg, nv)
    assert not_ok(r) == {check_id: status}, {i: r[i].message for i in not_ok(r)}
    assert r[check_id].hint and "hostcheck baseline" in r[check_id].hint


def test_the_messages_name_the_part_and_the_baselines_figure(tree):
    cfg = record(tree)
    _memory_short(6)(tree)
    put(tree, "sys/bus/pci/devices/0000:5d:00.0/current_link_width", "8\n")
    r = judge(tree, cfg, nvml(g3={"vbios": "96.00.AA.00.01"}))
    assert "-6.0%" in r["baseline.E002"].message and "more than 5% away" in r["baseline.E002"].message
    assert "GPU 0000:5d:00.0 at x8, the baseline has x16" in r["baseline.E006"].message
    assert (
        "0000:5d:00.0 on VBIOS 96.00.AA.00.01, the baseline has 96.00.99.00.01" in r["baseline.E005"].message
    )


def test_memory_within_the_tolerance_passes_and_the_tolerance_is_a_setting(tree):
    cfg = record(tree)
    _memory_short(4.9)(tree)
    assert judge(tree, cfg)["baseline.E002"].status is Status.PASS
    _memory_short(6)(tree)
    looser = dataclasses.replace(
        cfg, thresholds=parse({"thresholds": {"baseline_memory_tolerance": 0.1}}).thresholds
    )
    assert judge(tree, looser)["baseline.E002"].status is Status.PASS


def test_an_idle_gpu_link_at_a_lower_speed_only_warns(tree):
    cfg = record(tree)
    put(tree, "sys/bus/pci/devices/0000:18:00.0/current_link_speed", "2.5 GT/s PCIe\n")
    r = judge(tree, cfg)
    assert not_ok(r) == {"baseline.E006": Status.WARN} and "idle power saving" in r["baseline.E006"].message


#: RDMA ports the baseline records are judged by the fabric checks (one check per fault): fault -> (plant, the
#: check, its status, words of its message).
RDMA_FAULTS = {
    "rdma-port-at-200": (
        lambda t: put(t, "sys/class/infiniband/mlx5_1/ports/1/rate", "200 Gb/sec (4X HDR)\n"),
        "fabric.E002",
        Status.FAIL,
        "mlx5_1 port 1: at 200 Gb/s, expected 400 (the baseline)",
    ),
    "rdma-port-down": (
        lambda t: put(t, "sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n"),
        "fabric.E001",
        Status.FAIL,
        "mlx5_0 port 1: state DOWN",
    ),
    "rdma-nic-missing": (
        lambda t: (
            shutil.rmtree(t / "sys/class/infiniband/mlx5_1"),
            shutil.rmtree(t / "sys/bus/pci/devices/0000:2c:00.0"),
        ),
        "fabric.E001",
        Status.FAIL,
        "mlx5_1:1 missing (in the baseline)",
    ),
}
FABRIC = [c for c in all_checks() if c.id in ("fabric.E001", "fabric.E002")]


@pytest.mark.parametrize("fault", sorted(RDMA_FAULTS))
def test_the_baselines_rdma_ports_are_judged_once_by_the_fabric_checks(tree, fault):
    from hostcheck.gather.rdma import gather_rdma

    plant, check_id, status, words = RDMA_FAULTS[fault]
    cfg = record(tree)
    plant(tree)
    snap = dataclasses.replace(
        S.make_snapshot(options=Options(config=cfg)),
        inventory=gather_inventory(str(tree), nvml()),
        rdma=gather_rdma(str(tree)),
    )
    results, _ = evaluate(snap, CHECKS + FABRIC)
    r = {x.id: x for x in results}
    assert not_ok(r) == {check_id: status}, {i: r[i].message for i in not_ok(r)}
    assert words in r[check_id].message, r[check_id].message
    assert "fabric.E001, E002 and E006" in " ".join(r["baseline.E004"].details)
    if fault == "rdma-nic-missing":
        assert any("not on the PCI bus" in d for d in r["baseline.E006"].details)
        assert "lspci" in r[check_id].hint and "mlxfwmanager" in r[check_id].hint


# --- nothing to compare, nothing read: said, never a fail -------------------------------------------------------


def test_without_a_baseline_section_every_check_skips_and_says_how_to_make_one(tree):
    r = judge(tree, Config(path="/etc/gpunode/hostcheck.toml"))
    assert {i: res.status for i, res in r.items()} == dict.fromkeys(IDS, Status.SKIP)
    assert "no [baseline] section in /etc/gpunode/hostcheck.toml" in r["baseline.E001"].message
    assert "hostcheck baseline --write /etc/gpunode/hostcheck.toml" in r["baseline.E001"].hint


def test_a_part_the_baseline_does_not_record_is_not_compared(tree):
    r = judge(tree, parse({"baseline": {"memory_bytes": 2113311792 * 1024}}))
    assert r["baseline.E002"].status is Status.PASS
    assert {i for i, res in r.items() if res.status is Status.SKIP} == IDS - {"baseline.E002"}
    assert "records no NVMe drives" in r["baseline.E003"].message


def test_what_cannot_be_read_is_a_skip_or_an_error_never_a_fail(tree):
    cfg = record(tree)
    for rel in ("proc/meminfo", "proc/cpuinfo"):
        (tree / rel).unlink()
    shutil.rmtree(tree / "sys/devices/system/node")
    no_nvml = gather_nvml(nvml=S.FakeNvml(init_error=S.LIBRARY_NOT_FOUND), proc_name=str)
    r = judge(tree, cfg, no_nvml)
    for i in ("baseline.E001", "baseline.E002", "baseline.E005", "baseline.E007"):
        assert r[i].status is Status.SKIP, (i, r[i].message)
    snap = S.make_snapshot(options=Options(config=cfg))
    inv = gather_inventory(str(tree), nvml())
    denied = dataclasses.replace(
        inv, nvme=Unavailable(NO_PERMISSION, "/sys/class/nvme not readable (run as root)")
    )
    results, _ = evaluate(dataclasses.replace(snap, inventory=denied), CHECKS)
    e003 = next(x for x in results if x.id == "baseline.E003")
    assert e003.status is Status.ERROR and e003.hint == "run hostcheck as root"


# --- the section: written, read back, validated, put into a file -----------------------------------------------


def test_the_section_round_trips(tree):
    body, _ = section(gather_inventory(str(tree), nvml()), "h100-node-01", "2026-11-26T12:00:00Z")
    text = emit(body, comment="a comment\nover two lines")
    assert tomllib.loads(text) == {"baseline": body}
    assert parse(tomllib.loads(text)).baseline == parse({"baseline": body}).baseline


@pytest.mark.parametrize(
    "value",
    [
        'quote " and back\\slash',
        "tab\tand\x01control\x7f",
        "unicode ü € 😀",
        "",
        "[baseline]",
        "# not a comment",
    ],
)
def test_strings_round_trip_through_the_emitter(value):
    body = {"cpu_model": value, "numa_cpus": [value], "nvme": [{"model": value, "size_bytes": 1}]}
    assert tomllib.loads(emit(body))["baseline"] == body


def test_numbers_round_trip_and_what_toml_cannot_hold_is_refused():
    body = {"a": 0, "b": 1 << 62, "c": 2.5, "d": 1e-07, "e": [1.0, 32.0]}
    assert tomllib.loads(emit(body))["baseline"] == body
    for bad in (float("nan"), float("inf"), True, None, {"x": 1}):
        with pytest.raises(TomlError):
            emit({"x": bad})


CONFIG = """# site settings: kept byte for byte
profile = "full"   # a comment

[thresholds]
gpu_temp_warn_c = 78.0

[baseline]
cpu_cores = 1

[baseline.extra]
x = 1

[xid]
fail = [79]
"""


def test_splice_replaces_only_the_baseline_section():
    new = emit({"cpu_cores": 8, "nvme": [{"model": "m", "size_bytes": 2}]})
    out = splice(CONFIG, new)
    assert out == CONFIG.replace("[baseline]\ncpu_cores = 1\n\n[baseline.extra]\nx = 1\n\n", new + "\n")
    doc = loads(out)
    assert doc["baseline"] == {"cpu_cores": 8, "nvme": [{"model": "m", "size_bytes": 2}]}
    assert doc["xid"] == {"fail": [79]} and doc["thresholds"] == {"gpu_temp_warn_c": 78.0}


def test_splice_appends_a_section_the_file_lacks_and_keeps_every_byte_before_it():
    base = CONFIG.split("[baseline]")[0].rstrip(
        "\n"
    )  # no trailing newline: one is added, nothing else changes
    out = splice(base, emit({"cpu_cores": 8}))
    assert out.startswith(base) and out == base + "\n\n" + emit({"cpu_cores": 8})
    assert splice("", emit({"cpu_cores": 8})) == emit({"cpu_cores": 8})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("baseline.cpu_cores = 1\n[xid]\nfail = [79]\n", "cannot be placed"),  # a dotted key at the top
        ("profile = \n", "not valid TOML"),
        ('s = """\n[baseline]\n"""\n', "cannot be placed"),  # a header inside a multi-line string
    ],
)
def test_splice_refuses_what_it_cannot_place_safely(text, words):
    with pytest.raises(TomlError, match=words):
        splice(text, emit({"cpu_cores": 8}))


@pytest.mark.parametrize(
    ("section_", "key"),
    [
        ({"cpu_cores": "8"}, "baseline.cpu_cores"),
        ({"frobnicate": 1}, "baseline.frobnicate"),
        ({"nvme": [{"model": "m"}]}, "baseline.nvme[0].size_bytes"),
        ({"nvme": [{"model": "m", "size_bytes": 1, "x": 2}]}, "baseline.nvme[0].x"),
        ({"nvme": [{"model": "m", "size_bytes": -1}]}, "baseline.nvme[0].size_bytes"),
        ({"pcie": [{"address": "a"}]}, "baseline.pcie[0].kind"),
        ({"numa_cpus": ["0-3; rm -rf /"]}, "baseline.numa_cpus"),
        ({"gpus": [{"address": "a\nb", "name": "n", "vbios": "v"}]}, "baseline.gpus[0].address"),
        ({"rdma": "mlx5_0:1"}, "baseline.rdma"),
        ({"memory_bytes": 0}, "baseline.memory_bytes"),
    ],
)
def test_a_bad_baseline_section_is_a_config_error_naming_the_key(section_, key):
    with pytest.raises(ConfigError) as e:
        parse({"baseline": section_}, "h.toml")
    assert e.value.key == key, str(e.value)


# --- through the real command line: record, then check the same node ------------------------------------------


def _hostcheck(*argv: str, nvml_env: dict | None = None, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # The fake NVML as the module ``pynvml`` (tests/unit/fixtures/fakenvml), ahead of any installed one.
    env["PYTHONPATH"] = os.pathsep.join([str(FIXTURES / "fakenvml"), str(FIXTURES), str(REPO)])
    env["HOSTCHECK_FAKE_NVML"] = json.dumps(nvml_env or {})
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "hostcheck", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def _check(tmp_path: Path, tree: Path, cfg: Path, nvml_env: dict | None = None) -> dict[str, dict]:
    facts = tmp_path / "facts"
    facts.mkdir(exist_ok=True)
    p = _hostcheck(
        "--config", str(cfg), "--host-root", str(tree), "--only", "baseline,fabric.E001,fabric.E002", "--json",
        "--facts-dir", str(facts), "--state-file", str(tmp_path / "state.json"),
        nvml_env=nvml_env, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr
    return {c["id"]: c for c in json.loads(p.stdout)["checks"]}


@pytest.mark.parametrize("fault", ["none", "missing-nvme-drive", "memory-6pct-short", "gpu-on-another-vbios",
                                   "gpu-link-x8", "rdma-port-at-200"])  # fmt: skip
def test_baseline_then_check_through_the_cli(tmp_path, tree, fault):
    """Recorded, then checked through the real command line (the RDMA ports by fabric.E001/E002)."""
    cfg = tmp_path / "hostcheck.toml"
    cfg.write_text('profile = "passive"\n\n[slurm]\ndrain = false\n')
    before = cfg.read_text()
    p = _hostcheck("baseline", "--host-root", str(tree), "--write", str(cfg), cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == "" and "[baseline] written to" in p.stderr, p.stderr
    assert cfg.read_text().startswith(before)  # the rest of the file, byte for byte
    assert loads(cfg.read_text())["baseline"]["gpus"][3]["vbios"] == "96.00.99.00.01"
    nvml_env = None
    if fault in RDMA_FAULTS:
        plant, check_id, status, _words = RDMA_FAULTS[fault]
        plant(tree)
    elif fault != "none":
        plant, gpus, check_id, status = FAULTS[fault]
        if plant:
            plant(tree)
        nvml_env = {"gpus": {k[1:]: v for k, v in gpus.items()}}
    checks = _check(tmp_path, tree, cfg, nvml_env)
    assert set(checks) == IDS | {"fabric.E001", "fabric.E002"}
    bad = {i: c["status"] for i, c in checks.items() if c["status"] != "pass"}
    assert bad == ({} if fault == "none" else {check_id: status.value}), {
        i: checks[i]["message"] for i in bad
    }


def test_baseline_prints_toml_or_json_and_writes_nothing_by_default(tmp_path, tree):
    p = _hostcheck("baseline", "--host-root", str(tree), cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("[baseline]\n")
    assert parse(tomllib.loads(p.stdout)).baseline.cpu_threads == 16
    j = _hostcheck("baseline", "--host-root", str(tree), "--json", cwd=tmp_path)
    assert j.returncode == 0 and json.loads(j.stdout)["memory_bytes"] == 2113311792 * 1024
    assert sorted(os.listdir(tmp_path)) == ["host"]


def test_baseline_write_refuses_a_config_file_it_cannot_keep(tmp_path, tree):
    bad = tmp_path / "bad.toml"
    bad.write_text('profile = "turbo"\n')
    p = _hostcheck("baseline", "--host-root", str(tree), "--write", str(bad), cwd=tmp_path)
    assert p.returncode == 2 and "profile" in p.stderr and "fix the file first" in p.stderr, p.stderr
    assert bad.read_text() == 'profile = "turbo"\n'
    p = _hostcheck("baseline", "--json", "--write", str(bad), cwd=tmp_path)
    assert p.returncode == 2 and "cannot go with --write" in p.stderr


def test_a_written_file_keeps_its_mode(tmp_path, tree):
    cfg = tmp_path / "hostcheck.toml"
    cfg.write_text("[baseline]\ncpu_cores = 1\n")
    cfg.chmod(0o640)
    p = _hostcheck("baseline", "--host-root", str(tree), "--write", str(cfg), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert cfg.stat().st_mode & 0o777 == 0o640 and loads(cfg.read_text())["baseline"]["cpu_cores"] == 8
