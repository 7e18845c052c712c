"""NCCL's own configuration, read where NCCL reads it (fabric.E009, hostcheck.gather.nccl_conf): the environment
first, then the file NCCL_CONF_FILE names or else ~/.nccl.conf, then /etc/nccl.conf, the first source that sets a
variable winning (NVIDIA/nccl src/misc/param.cc initEnvFunc/setEnvFile, src/os/linux.cc ncclOsSetEnv: setenv with
overwrite 0), all of it under the one host root. A stale setting is named by its file and line; one NCCL uses
fails, one shadowed by an earlier source warns.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import fabrictree as T
import hostcheck_scenarios as S
import pytest

from hostcheck import gather as G
from hostcheck.checks import all_checks
from hostcheck.config import Config, parse
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.nccl_conf import (
    CONF_FILE,
    ENV_FILE,
    ENVIRONMENT,
    SYSTEM_CONF,
    USER_CONF,
    parse_conf,
    parse_passwd,
    read_nccl_config,
)
from hostcheck.registry import Status

E009 = [c for c in all_checks() if c.id == "fabric.E009"]


@pytest.fixture
def ib(tmp_path):
    return T.build(tmp_path / "host", "h100_ib")


def e009(root: Path, tmp: Path, env: str | None = "", config: Config | None = None, **opts):
    """fabric.E009 through the real gatherer; ``env``: the training environment file's text (None: no
    --env-file, so the one under the host root is read)."""
    kw = {}
    if env is not None:
        (tmp / "env").write_text(env)
        kw["env_file"] = str(tmp / "env")
    options = Options(
        host_root=str(root), state_file=str(tmp / "st.json"), config=config or Config(), **kw, **opts
    )
    snap = dataclasses.replace(S.make_snapshot(options=options), rdma=G.gather(options, {"rdma"}).rdma)
    results, _ = evaluate(snap, E009)
    return results[0], snap.rdma.nccl


def test_ncclconf_lines_are_read_as_ncclss_setenvfile_reads_them():
    text = (
        '# NCCL_IB_HCA=x\nNCCL_IB_HCA=mlx5_0\nNCCL_IB_HCA=mlx5_9\nNOEQUALS\nNCCL_DEBUG = WARN\nNCCL_X="q"\r\n'
    )
    got = {s.name: (s.value, s.line) for s in parse_conf(text)}
    # The first line wins, spaces and quotes stay, a carriage return stays: NCCL strips only the newline.
    assert got == {"NCCL_IB_HCA": ("mlx5_0", 2), "NCCL_DEBUG ": (" WARN", 5), "NCCL_X": ('"q"\r', 6)}
    assert len(parse_conf("NCCL_A=" + "x" * 5000)[0].value) == 1023
    assert parse_passwd("alice:x:1000:1000::/home/alice:/bin/bash\nbad line\nbob:x:1::rel:/bin/sh\n") == {
        "alice": "/home/alice"
    }


def test_the_environment_wins_over_the_files_and_a_stale_shadowed_value_warns(ib, tmp_path):
    T.put(ib, "etc/nccl.conf", "NCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5_9\n")
    r, cfg = e009(ib, tmp_path, "NCCL_IB_HCA=mlx5\n")
    assert [s.kind for s in cfg.sources] == [ENV_FILE, SYSTEM_CONF]
    assert cfg.effective()["NCCL_IB_HCA"] == "mlx5"
    assert r.status is Status.WARN and "NCCL_IB_HCA=mlx5_9 (/etc/nccl.conf:2) names mlx5_9" in r.message
    assert "shadowed" in r.message and r.brief == "IB_HCA mlx5_9 absent (nccl.conf:2)"


def test_a_stale_value_in_etc_nccl_conf_that_nccl_uses_fails_naming_the_file_and_line(ib, tmp_path):
    T.put(ib, "etc/nccl.conf", "NCCL_DEBUG=WARN\n\nNCCL_SOCKET_IFNAME=ib0\n")
    r, _ = e009(ib, tmp_path)
    assert r.status is Status.FAIL and "NCCL_SOCKET_IFNAME=ib0 (/etc/nccl.conf:3) names ib0" in r.message
    assert len(f"hostcheck: fabric.E009 {r.brief}") <= 80 and "nccl.conf:3" in r.brief


def test_nccl_conf_file_replaces_the_users_file_and_comes_before_etc_nccl_conf(ib, tmp_path):
    T.put(ib, "etc/passwd", "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/bash\n")
    T.put(ib, "home/alice/.nccl.conf", "NCCL_IB_HCA=mlx5_77\n")
    T.put(ib, "opt/site/nccl.conf", "NCCL_IB_HCA=mlx5_42\n")
    T.put(ib, "etc/nccl.conf", "NCCL_IB_HCA=mlx5\n")
    cfg = parse({"fabric": {"nccl_users": ["alice"]}})
    r, nccl = e009(ib, tmp_path, "NCCL_CONF_FILE=/opt/site/nccl.conf\n", cfg)
    assert [s.kind for s in nccl.sources] == [ENV_FILE, CONF_FILE, SYSTEM_CONF]
    assert "~/.nccl.conf not read: NCCL reads it only when NCCL_CONF_FILE is not set" in nccl.notes
    assert r.status is Status.FAIL and "(/opt/site/nccl.conf:1) names mlx5_42" in r.message
    assert "mlx5_77" not in r.message and nccl.effective()["NCCL_IB_HCA"] == "mlx5_42"


def test_the_training_users_nccl_conf_is_read_from_their_home_under_the_host_root(ib, tmp_path):
    T.put(ib, "etc/passwd", "alice:x:1000:1000::/home/alice:/bin/bash\n")
    T.put(ib, "home/alice/.nccl.conf", '#site\nNCCL_IB_HCA="mlx5_0"\n')
    cfg = parse({"fabric": {"nccl_users": ["alice", "nobody_here"]}})
    r, nccl = e009(ib, tmp_path, "", cfg)
    assert [s.kind for s in nccl.sources] == [ENV_FILE, USER_CONF, SYSTEM_CONF]
    assert r.status is Status.FAIL and '(/home/alice/.nccl.conf:2) names "mlx5_0' in r.message
    assert "the quotes are part of the value" in r.message
    assert "~nobody_here/.nccl.conf not read: no such user in /etc/passwd" in r.details


def test_under_another_host_root_nothing_is_read_from_this_machine(ib, tmp_path, monkeypatch):
    """One root for everything: not this process's environment, not this machine's training environment file or
    facts; the training environment file is the one under the root (its facts', else the default path)."""
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_999")
    T.put(ib, "etc/gpunode/training.env", "NCCL_IB_HCA=mlx5_5\n")
    r, nccl = e009(ib, tmp_path, None, facts_dir=str(tmp_path / "nofacts"))
    assert ENVIRONMENT not in [s.kind for s in nccl.sources]
    assert nccl.sources[0].path == str(ib / "etc/gpunode/training.env")
    assert r.status is Status.PASS and "mlx5_999" not in r.message and "NCCL_IB_HCA=mlx5_5" in r.message
    T.put(ib, "etc/ansible/facts.d/gpunode_tuning.fact", '{"env_file": "/srv/train.env"}\n')
    T.put(ib, "srv/train.env", "NCCL_IB_HCA=mlx5_31\n")
    r, nccl = e009(ib, tmp_path, None)
    assert nccl.sources[0].path == str(ib / "srv/train.env") and r.status is Status.FAIL


def test_on_the_node_itself_the_environment_and_the_job_users_file_are_read(tmp_path, monkeypatch):
    """Host root /: this process's environment comes after the training environment file; a Slurm prolog's
    SLURM_JOB_USER is the training user whose ~/.nccl.conf NCCL reads."""
    import pwd

    me = pwd.getpwuid(os.getuid())
    env = {"NCCL_IB_HCA": "mlx5_2", "SLURM_JOB_USER": me.pw_name, "PATH": "/bin"}
    (tmp_path / "env").write_text("NCCL_IB_HCA=mlx5_1\n")
    cfg = read_nccl_config("/", str(tmp_path / "env"), env, ())
    kinds = [s.kind for s in cfg.sources]
    assert kinds[:2] == [ENV_FILE, ENVIRONMENT] and kinds[-1] == SYSTEM_CONF
    uses = [(src.kind, used) for _s, src, used in cfg.settings("NCCL_IB_HCA")]
    assert uses[:2] == [(ENV_FILE, True), (ENVIRONMENT, False)]
    homes = [s.path for s in cfg.sources if s.kind == USER_CONF]
    assert homes == [os.path.join(me.pw_dir, ".nccl.conf")]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
        (lambda p: p.write_bytes(b"NCCL_IB_HCA=\xff\xfe\n"), "is not UTF-8 text"),
        (lambda p: os.symlink("/dev/zero", p), "is a character device"),
        (lambda p: p.write_bytes(b"#" * (1 << 17)), "more than the 65536 read here"),
    ],
)
def test_an_nccl_file_that_cannot_be_read_is_said_never_waited_on(ib, tmp_path, make, words):
    (ib / "etc").mkdir(exist_ok=True)
    make(ib / "etc/nccl.conf")
    r, _ = e009(ib, tmp_path)
    assert r.status is Status.WARN and "/etc/nccl.conf (/etc/nccl.conf) not read" in r.message
    assert words in r.message, r.message


def test_ten_thousand_entries_are_judged_in_part_and_said_so(ib, tmp_path):
    T.put(ib, "etc/nccl.conf", "NCCL_IB_HCA=" + ",".join(["mlx5_0"] + ["ib"] * 10000) + "\n")
    r, nccl = e009(ib, tmp_path)
    assert len(nccl.sources[-1].settings[0].value) == 1023  # NCCL's own 1024-byte buffer
    assert r.status is Status.FAIL and "more entries not judged (the first 64 were)" in r.message
    assert "names ib, ib, ib, ib, ib, ib (+57 more), which do not exist" in r.message and len(r.message) < 600


def test_a_name_with_spaces_is_never_read_by_nccl_and_said_so(ib, tmp_path):
    T.put(ib, "etc/nccl.conf", "NCCL_IB_HCA = mlx5_0\n")
    r, _ = e009(ib, tmp_path)
    assert r.status is Status.WARN and "'NCCL_IB_HCA ' (/etc/nccl.conf:1)" in r.message
    assert "NCCL takes the name with its spaces" in r.message
