"""The one reader of files someone else can write (hostcheck.infile): each refusal with the fault planted, and
the file read when it is absent."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from hostcheck import infile
from hostcheck.infile import ReadError


def _within(seconds: float, fn):
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the read blocked"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_a_regular_file_is_read(tmp_path):
    (tmp_path / "f").write_text("héllo\n")
    assert infile.read_text(str(tmp_path / "f")) == "héllo\n"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "f")
    with pytest.raises(ReadError, match="is a FIFO, not a regular file") as exc:
        _within(5, lambda: infile.read_bytes(str(tmp_path / "f")))
    assert exc.value.kind == infile.NOT_A_FILE


@pytest.mark.parametrize("follow", [True, False])
def test_a_link_to_dev_zero_is_never_read(tmp_path, follow):
    (tmp_path / "f").symlink_to("/dev/zero")
    with pytest.raises(ReadError, match="character device" if follow else "symbolic link"):
        _within(5, lambda: infile.read_bytes(str(tmp_path / "f"), follow=follow))


def test_a_link_to_a_file_is_followed_only_where_the_caller_says(tmp_path):
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert infile.read_text(str(tmp_path / "link")) == "x"
    with pytest.raises(ReadError, match="symbolic link"):
        infile.read_text(str(tmp_path / "link"), follow=False)


def test_a_folder_a_socket_and_a_missing_file(tmp_path):
    with pytest.raises(ReadError, match="a folder"):
        infile.read_bytes(str(tmp_path))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(ReadError, match="socket"):
            infile.read_bytes(str(tmp_path / "sock"))
    with pytest.raises(ReadError, match="does not exist") as exc:
        infile.read_bytes(str(tmp_path / "nope"))
    assert exc.value.kind == infile.MISSING
    (tmp_path / "dangling").symlink_to(tmp_path / "nope")
    with pytest.raises(ReadError, match="broken symbolic link"):
        infile.read_bytes(str(tmp_path / "dangling"))


def test_the_size_cap_refuses_or_truncates(tmp_path):
    p = tmp_path / "big"
    with open(p, "wb") as f:
        f.truncate(50 << 20)  # sparse: costs no disk
    with pytest.raises(ReadError, match="52428800 bytes") as exc:
        infile.read_bytes(str(p), 1 << 20)
    assert exc.value.kind == infile.TOO_LARGE
    assert len(infile.read_bytes(str(p), 100, truncate=True)) == 100
    p.write_bytes(b"12345")
    assert infile.read_bytes(str(p), 5) == b"12345"


def test_strict_decoding_names_the_first_bad_byte(tmp_path):
    (tmp_path / "f").write_bytes(b"ok=1\n\xff\xfe")
    with pytest.raises(ReadError, match=r"not UTF-8 text \(byte 5\)") as exc:
        infile.read_text(str(tmp_path / "f"))
    assert exc.value.kind == infile.NOT_TEXT
    assert infile.read_text(str(tmp_path / "f"), strict=False) == "ok=1\n\ufffd\ufffd"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file(tmp_path):
    p = tmp_path / "f"
    p.write_text("x")
    p.chmod(0)
    with pytest.raises(ReadError, match="not readable"):
        infile.read_bytes(str(p))
