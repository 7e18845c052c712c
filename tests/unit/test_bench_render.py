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


def test_chart_child_without_pil_says_so(tmp_path, monkeypatch, capsys):
    import sys

    from hostcheck.bench import chart

    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(chart_spec(COMPS, "t")))
    assert chart.main([str(spec), str(tmp_path / "out.png")]) == 1
    assert "no PIL in this Python" in capsys.readouterr().out
    assert not (tmp_path / "out.png").exists()


def test_chart_is_drawn_with_the_bitmap_font_when_pil_has_no_freetype(tmp_path, monkeypatch):
    # pillow-simd built without libfreetype-dev (as on the demo node): load_default(size=) raises ImportError.
    import pytest

    image_font = pytest.importorskip("PIL.ImageFont")
    from hostcheck.bench import chart

    def no_freetype(size=None):
        raise ImportError("cannot import name '_imagingft' from 'PIL'")

    monkeypatch.setattr(image_font, "load_default", no_freetype)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(chart_spec(COMPS, "t")))
    assert chart.main([str(spec), str(tmp_path / "out.png")]) == 0
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
