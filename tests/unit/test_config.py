"""The configuration file: every key read and checked, unknown keys refused, a bad file one line with the file,
the key and the reason (exit 2), never a traceback; command-line options win over the file."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hostcheck import config
from hostcheck.config import ConfigError, parse

ROOT = Path(__file__).resolve().parents[2]

FULL = """
profile = "passive"
expect_gpus = 8
fail_level = "warn"
min_score = 90

[checks]
skip = ["tuning.E007", "workload"]

[thresholds]
gpu_temp_warn_c = 78
gpu_temp_fail_c = 85.5
retired_pages_fail = 30

[xid]
fail = [13]
ignore = [94, 79]
window_hours = 6

[[gpu_models]]
match = "B200"
name = "B200 as measured here"
bf16_tflops = 1500
copy_gbs = 6500

[slurm]
drain = true
node = "gpu07"
reason_prefix = "hostcheck"

[prometheus]
textfile = "/var/lib/prometheus/node-exporter/hostcheck.prom"
"""


def write(tmp_path, text: str) -> str:
    p = tmp_path / "hostcheck.toml"
    p.write_text(text)
    return str(p)


def test_a_full_file_reads_into_the_config(tmp_path):
    c = config.load(write(tmp_path, FULL), explicit=True)
    assert (c.profile, c.expect_gpus, c.fail_level, c.min_score) == ("passive", 8, "warn", 90)
    assert c.skip == ("tuning.E007", "workload")
    assert c.thresholds.gpu_temp_fail_c == 85.5 and c.thresholds.retired_pages_fail == 30
    assert c.xid.action(13) == "fail" and c.xid.action(94) == "ignore" and c.xid.action(79) == "ignore"
    assert c.xid.window_hours == 6
    (m,) = c.gpu_models
    assert m.matmul_tflops == {"bf16": 1500.0} and m.copy_gbs == 6500 and m.name == "B200 as measured here"
    assert c.slurm.drain and c.slurm.node == "gpu07"
    assert c.prometheus.endswith("hostcheck.prom")


def test_the_site_xid_lists_move_only_the_xids_they_name():
    base = config.default_xid_policy()
    c = parse({"xid": {"warn": [48]}})
    assert c.xid.action(48) == "warn"
    others = (base.fail | base.warn | base.ignore) - {48}
    assert all(c.xid.action(x) == base.action(x) for x in others)


def test_no_file_at_the_default_path_is_the_defaults_but_a_named_missing_file_is_an_error(tmp_path):
    assert config.load(str(tmp_path / "absent.toml"), explicit=False) == config.Config()
    with pytest.raises(ConfigError, match="cannot read it"):
        config.load(str(tmp_path / "absent.toml"), explicit=True)


@pytest.mark.parametrize(
    "text,key,reason",
    [
        ('profile = "fast"', "profile", "must be one of"),
        ("expect_gpus = -1", "expect_gpus", "from 0 to"),
        ('expect_gpus = "8"', "expect_gpus", "must be an integer, not a string"),
        ("expect_gpus = true", "expect_gpus", "not a boolean"),
        ("min_score = 101", "min_score", "from 0 to 100"),
        ("colour = 1", "colour", "unknown key"),
        ('[checks]\nskip = "gpu"', "checks.skip", "list of strings"),
        ("[checks]\nskip = [1]", "checks.skip", "list of strings"),
        ('[checks]\nonly = ["gpu"]\nsikp = []', "checks.sikp", "unknown key"),
        ("[thresholds]\ngpu_temp_warn_c = nan", "thresholds.gpu_temp_warn_c", "a number"),
        ("[thresholds]\ngpu_temp_warn_c = 90\ngpu_temp_fail_c = 85", "thresholds.gpu_temp_warn_c", "above"),
        ("[xid]\nfail = 79", "xid.fail", "list of integers"),
        ("[xid]\nfail = [79]\nignore = [79]", "xid.ignore", "also in xid.fail"),
        ("[xid]\nwindow_hours = 0", "xid.window_hours", "from"),
        ('[xid]\nunlisted = "panic"', "xid.unlisted", "one of"),
        ("xid = 3", "xid", "must be a table"),
        ('[[gpu_models]]\nname = "x"', "gpu_models[0].match", "required"),
        ('[[gpu_models]]\nmatch = "("', "gpu_models[0].match", "regular expression"),
        ('[[gpu_models]]\nmatch = "B200"\nbf16_tflops = -5', "gpu_models[0].bf16_tflops", "from"),
        ('[[gpu_models]]\nmatch = "B200"\nint8_tops = 5', "gpu_models[0].int8_tops", "unknown key"),
        ('[slurm]\ndrain = "yes"', "slurm.drain", "true or false"),
        ('[slurm]\nnode = "n1; reboot"', "slurm.node", "not a Slurm node name"),
        ('[slurm]\nreason_prefix = "a b"', "slurm.reason_prefix", "letters"),
        ('[prometheus]\ntextfile = "hostcheck.prom"', "prometheus.textfile", "absolute"),
        ('[prometheus]\ntextfile = "/x\\ny"', "prometheus.textfile", "one line"),
        ("profile = [", "", "not valid TOML"),
        ("a = 1\na = 2", "", "not valid TOML"),
        ("x = " + "[" * 5000 + "]" * 5000, "", "not valid TOML"),
    ],
)
def test_a_bad_file_names_the_key_and_the_reason(tmp_path, text, key, reason):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(path, explicit=True)
    assert info.value.key == key and reason in info.value.reason
    assert str(info.value).startswith(path + ": ") and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "dir", "binary", "huge"])
def test_files_that_are_not_toml_text_are_refused_without_blocking(tmp_path, kind):
    p = tmp_path / "c.toml"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "binary":
        p.write_bytes(b"\xff\xfe\x00profile")
    else:
        p.write_text("# x\n" * 300000)
    with pytest.raises(ConfigError, match="cannot read it"):
        config.load(str(p), explicit=True)


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "hostcheck", *argv], capture_output=True, text=True, timeout=120, env=env
    )


def test_the_command_exits_2_with_one_line_for_a_bad_file(tmp_path):
    p = run_cli("check", "--config", write(tmp_path, "[xid]\nfail = ['a']\n"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "xid.fail: must be a list of integers" in p.stderr
    assert "Traceback" not in p.stderr


def test_options_on_the_command_line_win_over_the_file(tmp_path):
    path = write(tmp_path, 'profile = "passive"\nexpect_gpus = 3\n[checks]\nonly = ["gpu"]\n')

    def e002(*more: str) -> dict:
        doc = json.loads(run_cli("check", "--config", path, "--json", *more).stdout)
        assert {c["category"] for c in doc["checks"]} == {"gpu"}
        return next(c for c in doc["checks"] if c["id"] == "gpu.E002")

    assert e002()["expected"] == 3
    assert e002("--expect-gpus", "0")["expected"] == 0


def test_without_tomllib_the_file_is_read_by_tomli_or_is_a_usage_error_that_says_what_to_do(
    tmp_path, monkeypatch
):
    """Python 3.9 and 3.10 (no tomllib): the file is read by tomli, pyproject.toml's dependency there (tomllib's
    source, same API: PEP 680); without tomli either, hostcheck runs, but the file it cannot read is never replaced
    by the defaults silently. With tomllib (the fault absent) the same file reads."""
    import tomllib

    path = write(tmp_path, "expect_gpus = 8\n")
    assert config.load(path, explicit=False).expect_gpus == 8
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import tomllib raises ImportError
    monkeypatch.setitem(sys.modules, "tomli", tomllib)  # tomli installed (tomllib is tomli 1.2's parser)
    assert config.load(path, explicit=True).expect_gpus == 8
    monkeypatch.setitem(sys.modules, "tomli", None)
    for explicit in (False, True):
        with pytest.raises(
            ConfigError,
            match=r"needs tomllib \(Python 3\.11\+\) or the package tomli on Python 3\.\d+: pip install tomli",
        ):
            config.load(path, explicit=explicit)
    assert config.load(str(tmp_path / "absent.toml"), explicit=False) == config.Config()


def test_every_hostcheck_module_parses_as_the_oldest_python_it_claims_and_guards_tomllib():
    """pyproject.toml's requires-python holds for every module, and every training Python the platform data
    can choose is at least that; tomllib (3.11) is imported only inside a guard."""
    floor = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert floor
    oldest = (int(floor.group(1)), int(floor.group(2)))
    for path in sorted((ROOT / "hostcheck").rglob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=oldest)
        for node in ast.walk(tree):
            if isinstance(node, ast.Try):
                continue
            body = getattr(node, "body", [])
            for stmt in body if isinstance(body, list) else []:
                if isinstance(stmt, ast.Import) and any(a.name in ("tomllib", "tomli") for a in stmt.names):
                    pytest.fail(f"{path}: {stmt.names[0].name} imported outside a try")
    platform = json.loads((ROOT / "hostcheck" / "data" / "platform.json").read_text())
    pythons = {
        tuple(int(x) for x in row["python"]["version"].split(".")[:2])
        for row in platform["os"].values()
        if row.get("python")
    }
    assert pythons and min(pythons) >= oldest, (sorted(pythons), oldest)
