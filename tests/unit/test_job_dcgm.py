"""DCGM's profiling fields in hostcheck job: ``dcgmi dmon`` output (fixtures in dcgmi's own layout, from NVIDIA/DCGM's
source, each file citing where), a fake ``dcgmi`` that answers, is absent, fails, hangs or prints garbage, and the
order of the signals: NVML GPM > DCGM profiling > NVML utilisation (labelled). The job's exit code is its own
whatever dmon does."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
from test_job_gpu import FakeGpmNvml, FakeNvml

from hostcheck.gather.nvml import NvmlSampler
from hostcheck.job import png
from hostcheck.job.analyse import SIGNAL_DCGM, SIGNAL_GPM, SIGNAL_UTIL, analyse
from hostcheck.job.dcgm import MAX_OUTPUT, DcgmRow, DcgmSampler, DmonParser, parse_dmon
from hostcheck.job.diagnosis import diagnose, gpu_words
from hostcheck.job.observe import observe
from hostcheck.job.records import read_run
from hostcheck.job.render import render_text, report_dict

FIX = Path(__file__).parent / "fixtures" / "dcgm"


def _dcgmi(tmp_path: Path, body: str) -> str:
    """A fake dcgmi: a shell script; the fixtures go in by path."""
    p = tmp_path / "dcgmi"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def _answers(tmp_path: Path, fixture: str = "dmon_two_gpus.txt") -> str:
    """dmon that prints its rows and keeps running, as it does until it is stopped."""
    return _dcgmi(tmp_path, f"cat '{FIX / fixture}'\nexec sleep 600")


# --- the parser --------------------------------------------------------------------------------------------


def test_dmon_rows_from_dcgmi_s_own_layout_as_percent_with_n_a_as_none():
    rows, error = parse_dmon((FIX / "dmon_two_gpus.txt").read_text())
    assert error is None
    # 16 rows for each GPU; the repeated header and the MIG instance's row are not rows
    assert len(rows) == 32
    assert rows[0] == DcgmRow(0, 99.1, 38.0, 21.0)
    assert rows[1] == DcgmRow(1, None, None, None)  # N/A
    assert rows[3] == DcgmRow(1, 0.0, 0.0, 0.0)
    assert {r.gpu for r in rows} == {0, 1}


def test_columns_are_found_by_their_names_not_their_order():
    rows, _ = parse_dmon("#Entity   SMOCC        SMACT\nID\nGPU 3     0.250        0.750\n")
    assert rows == [DcgmRow(3, None, 75.0, 25.0)]


@pytest.mark.parametrize(
    "fixture, needle",
    [
        ("dmon_no_host_engine.txt", "Unable to connect to host engine"),
        ("dmon_watch_error.txt", "Error setting watches. Result: -36"),
    ],
)
def test_an_error_line_is_kept_and_gives_no_row(fixture, needle):
    rows, error = parse_dmon((FIX / fixture).read_text())
    assert rows == [] and error is not None and needle in error


@pytest.mark.parametrize(
    "text",
    [
        "GPU 0     0.500        0.500        0.500\n",  # a row before any header
        "#Entity   GRACT        SMACT        SMOCC\nGPU 0     0.5\n",  # too few columns
        "#Entity   GRACT        SMACT        SMOCC\nGPU x     0.5 0.5 0.5\n",  # not an id
        "#Entity   GRACT        SMACT        SMOCC\nGPU-I 0   0.5 0.5 0.5\n",  # a MIG instance
        "\x00\xff garbage \x1b[2J\n" * 50,
    ],
)
def test_garbage_gives_no_row(text):
    assert parse_dmon(text)[0] == []


def test_values_out_of_a_ratio_s_range_are_none_not_figures():
    rows, _ = parse_dmon("#Entity SMACT SMOCC GRACT\nGPU 0 1.5 -0.1 nan\nGPU 0 inf 1.000 0.000\n")
    assert rows == [DcgmRow(0, None, None, None), DcgmRow(0, 0.0, None, 100.0)]


def test_rows_split_across_reads_are_whole_and_an_endless_line_is_dropped():
    p = DmonParser()
    assert p.feed("#Entity   GRACT        SMACT        SMOCC\nGPU 0     0.1") == []
    assert p.feed("00        0.200        0.300\nGPU 1") == [DcgmRow(0, 10.0, 20.0, 30.0)]
    assert p.feed("x" * 10_000) == [] and p._partial == ""  # bounded: no line grows without end
    assert p.feed("\nGPU 1     0.100        0.200        0.300\n") == [DcgmRow(1, 10.0, 20.0, 30.0)]


# --- the sampler: a real child through the one launcher --------------------------------------------------


def _poll_until(s: DcgmSampler, seconds: float = 5.0) -> list[DcgmRow]:
    rows: list[DcgmRow] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not rows and s.error is None:
        rows += s.poll()
        time.sleep(0.05)
    return rows


def test_the_sampler_reads_dmon_s_rows_and_stops_it(tmp_path):
    s = DcgmSampler(0.2, dcgmi=_answers(tmp_path))
    rows = _poll_until(s)
    pid = s._tool.proc.pid
    s.close()
    assert len(rows) == 32 and s.error is None and s.rows == 32
    assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_dmon_is_asked_for_the_three_fields_at_the_sampling_interval(tmp_path):
    argv = tmp_path / "argv"
    s = DcgmSampler(0.5, dcgmi=_dcgmi(tmp_path, f'echo "$@" > {argv}'))
    _poll_until(s)
    s.close()
    assert argv.read_text().split() == ["dmon", "-e", "1001,1002,1003", "-d", "500"]


def test_no_dcgmi_on_path_is_absent_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    s = DcgmSampler(0.2)
    assert s.absent and s.poll() == [] and "dcgmi not found" in (s.error or "")
    s.close()


@pytest.mark.parametrize(
    "body, needle",
    [
        (f"cat '{FIX / 'dmon_no_host_engine.txt'}'; exit 255", "Unable to connect to host engine"),
        (f"cat '{FIX / 'dmon_watch_error.txt'}' >&2; exit 220", "Error setting watches"),
        ("exit 0", "ended (exit 0) without a row"),
        ("kill -SEGV $$", "killed by signal SIGSEGV"),
    ],
)
def test_a_dmon_that_fails_says_why_and_gives_no_row(tmp_path, body, needle):
    s = DcgmSampler(0.2, dcgmi=_dcgmi(tmp_path, body))
    assert _poll_until(s) == []
    s.close()
    assert needle in (s.error or ""), s.error


def test_a_dmon_that_cannot_start_says_why(tmp_path):
    p = tmp_path / "dcgmi"
    p.write_text("not a program")
    s = DcgmSampler(0.2, dcgmi=str(p))  # not executable
    assert s.poll() == [] and "could not start" in (s.error or "")
    s.close()


def test_a_hung_dmon_gives_no_row_and_is_killed_at_close(tmp_path):
    s = DcgmSampler(0.2, dcgmi=_dcgmi(tmp_path, "exec sleep 600"))
    for _ in range(4):
        assert s.poll() == []
        time.sleep(0.05)
    pid = s._tool.proc.pid
    t = time.monotonic()
    s.close()
    assert time.monotonic() - t < 2.0
    assert "gave no row" in (s.error or "")
    assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_dmon_printing_garbage_without_end_is_read_only_so_far(tmp_path):
    s = DcgmSampler(0.2, dcgmi=_dcgmi(tmp_path, "exec cat /dev/zero"))
    end = time.monotonic() + 10
    while s.error is None and time.monotonic() < end:
        assert s.poll() == []
        time.sleep(0.02)
    s.close()
    assert s.read_bytes <= MAX_OUTPUT + 1 and "printed more than" in (s.error or "")


# --- the signals' order, all the way to the verdict, the text, the JSON and the picture -----------------------


def _observe(tmp_path, dcgmi: str | None, nvml, script: str = "import time; time.sleep(1.5)", absent=False):
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def dcgm(interval: float) -> DcgmSampler:
        s = DcgmSampler(interval, dcgmi=dcgmi)
        if absent:  # as on a node without DCGM
            s.absent, s.error, s._proc = True, "dcgmi not found (no DCGM)", None
        return s

    obs = observe(
        [sys.executable, "-c", script],
        str(run_dir),
        interval=0.2,
        nvml_factory=nvml,
        env={**os.environ},
        dcgm_factory=dcgm,
    )
    return obs, analyse(obs, read_run(str(run_dir)))


def _one_gpu(fake):
    def factory() -> NvmlSampler:
        fake.nvmlDeviceGetCount = lambda: 1
        return NvmlSampler(nvml=fake)

    return factory


def test_dcgm_sm_activity_not_utilisation_judges_a_gpu_without_gpm(tmp_path):
    """NVML utilisation 100% (a kernel always running) on a GPU without GPM, DCGM's SMACT 0.380: judged on
    utilisation the job is compute-bound; on DCGM's SM activity the GPU is 38% active, and every output says
    which signal it was."""
    obs, a = _observe(tmp_path, _answers(tmp_path), _one_gpu(FakeNvml(util=100)))
    assert obs.exit_code == 0 and obs.dcgm_error is None and obs.dcgm_samples
    assert a.gpu_signal == SIGNAL_DCGM and a.gpu_util == 38.0
    g0 = a.gpus[0]
    assert g0["util_mean"] == 100.0 and g0["sm_active_mean"] is None
    assert (g0["dcgm_sm_active_mean"], g0["dcgm_sm_occupancy_mean"], g0["dcgm_gr_active_mean"]) == (
        38.0,
        21.0,
        99.1,
    )
    v = diagnose(a)
    assert v.kind == "idle-gpu" and "GPU SM activity 38% (DCGM profiling)" in v.headline
    text = render_text(a, v)
    assert "judged by sm-activity (DCGM profiling)" in text
    assert "SM activity 38%, SM occupancy 21%, graphics engine 99% (DCGM profiling), utilisation 100%" in text
    doc = report_dict(a, v)
    assert doc["gpu_signal"] == doc["timeline"]["gpu_signal"] == SIGNAL_DCGM
    assert {p for _t, p in doc["timeline"]["gpu"]} == {38.0}
    assert png._gpu_label(doc["timeline"]["gpu_signal"]) == "GPU SM activity % (DCGM profiling)"


def test_utilisation_alone_still_judges_when_dcgm_is_absent(tmp_path):
    """The same GPU without DCGM: the last resort, labelled (the verdict today's code gives)."""
    _obs, a = _observe(tmp_path, None, _one_gpu(FakeNvml(util=100)), absent=True)
    assert a.gpu_signal == SIGNAL_UTIL and a.dcgm_error is None
    assert "dcgm_sm_active_mean" in a.gpus[0] and a.gpus[0]["dcgm_sm_active_mean"] is None
    assert "DCGM" not in render_text(a, diagnose(a))


def test_gpm_comes_before_dcgm(tmp_path):
    """GPM says 38%, DCGM (its SMACT row 0.380 too, but GPM is read first) is kept beside it, not used."""
    _obs, a = _observe(tmp_path, _answers(tmp_path), _one_gpu(FakeGpmNvml(util=100, sm=38.0)))
    assert a.gpu_signal == SIGNAL_GPM and a.gpus[0]["dcgm_sm_active_mean"] == 38.0
    assert report_dict(a, diagnose(a))["timeline"]["gpu_signal"] == SIGNAL_GPM


def test_dcgm_without_nvml_still_gives_the_gpus_activity(tmp_path):
    """No nvidia-ml-py, a DCGM host engine: both GPUs from DCGM; GPU 1 was idle."""
    obs, a = _observe(tmp_path, _answers(tmp_path), lambda: NvmlSampler(loader=_no_pynvml))
    assert obs.gpu_error and a.gpu_signal == SIGNAL_DCGM
    assert [g["dcgm_sm_active_mean"] for g in a.gpus] == [38.0, 0.0]
    assert [g["samples"] for g in a.gpus] == [0, 0]


def _no_pynvml():
    raise ImportError("No module named 'pynvml'")


@pytest.mark.parametrize(
    "body, needle",
    [
        (f"cat '{FIX / 'dmon_no_host_engine.txt'}'; exit 255", "Unable to connect to host engine"),
        (f"cat '{FIX / 'dmon_watch_error.txt'}' >&2; exit 220", "Error setting watches"),
        ("exec sleep 600", "gave no row"),
        ("head -c 300000 /dev/urandom; exec sleep 600", "gave no row"),
    ],
)
def test_a_failing_dmon_falls_back_to_labelled_utilisation_and_keeps_the_job_s_exit_code(
    tmp_path, body, needle
):
    obs, a = _observe(
        tmp_path,
        _dcgmi(tmp_path, body),
        _one_gpu(FakeNvml(util=100)),
        script="import time, sys; time.sleep(1); sys.exit(3)",
    )
    assert obs.exit_code == 3 and obs.dcgm_samples == ()
    assert a.gpu_signal == SIGNAL_UTIL and needle in (a.dcgm_error or ""), a.dcgm_error
    assert gpu_words(a) == "GPU utilisation 100% (NVML: kernel-time utilisation, not SM activity)"
    v = diagnose(a)
    text = render_text(a, v)
    assert "DCGM      profiling fields not used: " in text
    assert report_dict(a, v)["dcgm_error"] == a.dcgm_error
