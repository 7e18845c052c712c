"""hostcheck.bench.render and .chart's spec: the table, findings, errors, skips, the JSON document."""

from __future__ import annotations

import json

from hostcheck.bench import BENCH_SCHEMA_VERSION
from hostcheck.bench.chart import chart_spec
from hostcheck.bench.plan import Skip
from hostcheck.bench.render import document, render_json, render_text, table
from hostcheck.bench.run import ERROR, FINDING, MEASURED, BenchRun, Comparison, Side
from hostcheck.bench.stats import summarize


def comp(key, ratios, status=MEASURED, message="", a_error=None, tuning="allocator"):
    a = [200.0] * len(ratios)
    b = [200.0 * r for r in ratios]
    return Comparison(
        group=f"{tuning}/pipeline",
        tuning=tuning,
        workload="pipeline",
        title="pipeline, 0 workers",
        a=Side("glibc", "glibc malloc", {}, {}, tuple(a), a_error),
        b=Side(key, key, {"LD_PRELOAD": "/x.so"}, {}, tuple(b)),
        unit="img/s",
        status=status,
        summary=summarize(a, b),
        message=message,
        notes=(f"mapped: /usr/lib/{key}.so",) if status == MEASURED else (),
        orders=tuple("AB" if i % 2 == 0 else "BA" for i in range(len(ratios))),
    )


COMPS = (
    comp("jemalloc", [0.73, 0.70, 0.75, 0.72, 0.74]),
    comp("tcmalloc", [0.4, 1.1, 0.9, 1.2, 0.95]),
    comp("tcmalloc_minimal", [], status=ERROR, message="LD_PRELOAD path did not load: /x.so is not mapped"),
    comp(
        "shm-large",
        [],
        status=FINDING,
        message="a 64M /dev/shm breaks DataLoader workers: bus error",
        a_error="crashed",
        tuning="shm",
    ),
)
SKIPS = (Skip("pin_memory", "pin_memory on vs off", "no CUDA device", "run the bench on a GPU node"),)


def doc():
    bench = BenchRun(COMPS, (), ("writing 192 JPEGs failed: disk full",))
    host = {
        "hostname": "node1",
        "os": "Debian 12",
        "cpus": 2,
        "physical_cores": 2,
        "gpus": [],
        "container": "podman",
    }
    py = {
        "executable": "/venv/bin/python",
        "source": "--python",
        "version": "3.11.7",
        "torch": "2.13.0",
        "pil": "Pillow 13",
    }
    env = {"stripped": {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}}
    opts = {"pairs": 5, "warmup_pairs": 0, "images": 192}
    return document(host, py, env, opts, bench, SKIPS, None, "2026-01-01T00:00:00Z", 12.3)


def test_table_columns_and_verdicts():
    lines = table(COMPS).splitlines()
    assert lines[0].split()[:4] == ["tuning", "workload", "A", "(baseline)"]
    je, tc, err, shm = lines[1:]
    assert "0.73x" in je and "0.70-0.75" in je and je.endswith("hurts") and " 200 " in je and " 146 " in je
    assert tc.endswith("no clear effect (noisy)")
    assert err.endswith("error") and " - " in err
    assert shm.endswith("helps (A breaks)")


def test_text_report_says_what_was_removed_failed_found_and_skipped():
    text = render_text(doc(), COMPS, SKIPS)
    assert text.startswith(
        "hostcheck bench on node1: Debian 12, 2 CPUs (2 cores), no GPU, in a podman container"
    )
    assert "removed from every run's environment (each comparison sets its own): LD_PRELOAD=" in text
    assert "FINDING shm/pipeline:shm-large: a 64M /dev/shm breaks DataLoader workers: bus error" in text
    assert "ERROR allocator/pipeline:tcmalloc_minimal: LD_PRELOAD path did not load" in text
    assert "ERROR writing 192 JPEGs failed: disk full" in text
    assert "jemalloc [allocator/pipeline]: mapped: /usr/lib/jemalloc.so" in text
    assert (
        "skipped pin_memory (pin_memory on vs off): no CUDA device; hint: run the bench on a GPU node" in text
    )


def test_json_document_is_versioned_and_keeps_every_pair():
    d = json.loads(render_json(doc()))
    assert d["schema"] == "hostcheck-bench" and d["schema_version"] == BENCH_SCHEMA_VERSION
    assert d["verdict_rule"]["helps"].startswith("median paired ratio >= 1.05")
    je = d["comparisons"][0]
    assert je["key"] == "allocator/pipeline:jemalloc" and je["verdict"] == "hurts"
    assert [p["order"] for p in je["pairs"]] == ["AB", "BA", "AB", "BA", "AB"]
    assert je["pairs"][0]["ratio"] == 0.73 * 200 / 200 and je["b"]["env"] == {"LD_PRELOAD": "/x.so"}
    assert d["comparisons"][3]["status"] == "finding" and d["comparisons"][3]["verdict"] == "helps"
    assert d["skipped"][0]["tuning"] == "pin_memory" and d["problems"] and d["interrupted"] is False


def test_chart_spec_rows():
    spec = chart_spec(COMPS, "title", "sub")
    je, tc, err, shm = spec["rows"]
    assert je["ratio"] == 0.73 and je["lo"] == 0.7 and je["hi"] == 0.75 and je["verdict"] == "hurts"
    assert tc["noisy"] is True
    assert err["text"].startswith("error: LD_PRELOAD path did not load") and "ratio" not in err
    assert shm["text"] == "a 64M /dev/shm breaks DataLoader workers" and shm["status"] == "finding"


def _decode(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, RGB rows) of a PNG the one engine wrote (8-bit RGB, every row Sub-filtered)."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows = zlib.decompress(idat), 3 * width, []
    for y in range(height):
        line = raw[y * (stride + 1) : (y + 1) * (stride + 1)]
        assert line[0] == 1
        out = bytearray(line[1:])
        for i in range(3, stride):
            out[i] = (out[i] + out[i - 3]) & 0xFF
        rows.append(bytes(out))
    return width, height, rows


def _colours(data: bytes) -> set[tuple[int, ...]]:
    _w, _h, rows = _decode(data)
    return {tuple(r[i : i + 3]) for r in rows for i in range(0, len(r), 3)}


def test_the_chart_is_drawn_by_the_one_png_engine_without_pil(tmp_path, monkeypatch):
    """One PNG engine (hostcheck.png, the job timeline's too): the chart needs no PIL and no child. It
    replaces the PIL chart drawn in the training Python, whose two tests (no PIL: no chart; no FreeType: the
    bitmap font) had nothing left to test."""
    import sys

    from hostcheck.bench import chart

    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    out = tmp_path / "out.png"
    assert chart.render_png(chart_spec(COMPS, "t", "sub"), str(out)) is None
    width, height, _ = _decode(out.read_bytes())
    assert width == chart.LABEL_W + chart.PLOT_W + chart.RIGHT and height == chart.TOP + chart.ROW_H * 4 + 50
    got = _colours(out.read_bytes())
    # Planted: the jemalloc row hurts (red bar), the finding's text is orange.
    assert chart.COLOURS["hurts"] in got and chart.COLOURS["finding"] in got
    # Absent: no comparison helps, so no green bar.
    assert chart.COLOURS["helps"] not in got
    helps = chart_spec([comp("tcmalloc", [1.2, 1.25, 1.22, 1.21, 1.23])], "t")
    assert chart.COLOURS["helps"] in _colours(chart.draw(helps))
    assert chart.render_png(helps, str(tmp_path / "missing" / "out.png")).startswith("writing ")


def test_names_and_errors_from_the_node_cannot_forge_a_line_or_an_escape():
    """A GPU name from the training Python's torch and a worker's error line, each with a new line that starts a
    line of its own and an OSC escape (xterm: ESC ] 0 ; title BEL), come out escaped."""
    forged = "\n[PASS] all good\x1b]0;pwned\x07"
    d = doc()
    d["host"]["gpus"] = ["NVIDIA H100" + forged]
    errs = (comp("tcmalloc_minimal", [], status=ERROR, message="worker died" + forged),)
    text = render_text(d, errs, ())
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.startswith("[PASS]") for line in text.splitlines()), text
    assert "NVIDIA H100\\n[PASS] all good\\x1b]0;pwned\\x07" in text and "worker died\\n[PASS]" in text
