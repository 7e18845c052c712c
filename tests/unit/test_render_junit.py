"""--junit: every file validates against Jenkins' junit-10.xsd (the schema pytest's --junitxml targets, kept in
fixtures/schemas with its source), whatever the checks' texts hold."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import hostcheck_scenarios as S
import pytest
import xmlschema

from hostcheck.check.render import clean_text
from hostcheck.check.render.junit import render_junit
from hostcheck.check.render.prometheus import render_prometheus
from hostcheck.checks import all_checks
from hostcheck.core import build_report, evaluate
from hostcheck.registry import Status
from hostcheck.report import Report

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parent / "fixtures" / "schemas" / "junit-10.xsd"))
CORE = [c for c in all_checks() if c.category != "workload"]
CONTROL = "colour \x1b[31mred\x1b[0m nul \x00 bell \x07 vt \x0b ff \x0c nonchar \ufffe tab \t end"


def report_for(name: str) -> Report:
    snap = S.SCENARIOS[name][0]()
    results, v = evaluate(snap, CORE)
    return build_report(snap, results, v, started=0.0, when="2026-05-01T12:00:00+00:00")


def assert_valid(text: str) -> ET.Element:
    errors = [str(e.reason) for e in SCHEMA.iter_errors(text)]
    assert not errors, errors
    return ET.fromstring(text)


@pytest.mark.parametrize("name", sorted(S.SCENARIOS))
def test_every_scenario_validates_against_junit_10_xsd(name):
    root = assert_valid(render_junit(report_for(name)))
    suites = root.findall("testsuite")
    assert suites and int(root.get("tests")) == sum(int(s.get("tests")) for s in suites)
    for key in ("failures", "errors"):
        assert int(root.get(key)) == sum(int(s.get(key)) for s in suites)
    assert root.get("skipped") is None  # the schema allows it on testsuite only


def test_statuses_map_to_failure_error_skipped_and_system_out():
    report = report_for("pcie_x8")
    root = assert_valid(render_junit(report))
    cases = {tc.get("name").split(" ", 1)[0]: tc for tc in root.iter("testcase")}
    for r in report.results:
        tags = [child.tag for child in cases[r.id]]
        expected = {Status.FAIL: "failure", Status.ERROR: "error", Status.SKIP: "skipped"}.get(
            r.status, "system-out"
        )
        assert tags == [expected], (r.id, r.status, tags)
    skipped = sum(r.status == Status.SKIP for r in report.results)
    assert skipped and sum(int(s.get("skipped")) for s in root.findall("testsuite")) == skipped


def test_the_schema_rejects_what_hostcheck_used_to_write():
    """The fault the fix removed, planted: ``skipped`` on <testsuites> fails the schema, so the test above would see it."""
    root = ET.fromstring(render_junit(report_for("pcie_x8")))
    root.set("skipped", "1")
    assert not SCHEMA.is_valid(ET.tostring(root, encoding="unicode"))


def test_control_characters_in_texts_keep_the_file_xml_and_show_as_escapes():
    report = report_for("pcie_x8")
    hostile = tuple(
        dataclasses.replace(r, message=CONTROL, hint=CONTROL, title=CONTROL, details=(CONTROL,))
        for r in report.results
    )
    report = dataclasses.replace(report, results=hostile, host={**report.host, "hostname": CONTROL})
    root = assert_valid(render_junit(report))
    seen = clean_text(CONTROL)
    assert (
        seen
        == "colour \\x1b[31mred\\x1b[0m nul \\x00 bell \\x07 vt \\x0b ff \\x0c nonchar \\ufffe tab \t end"
    )
    failure = next(root.iter("failure"))
    assert failure.get("message") == seen and failure.text.startswith(seen)
    assert root.find("testsuite").get("hostname") == seen


def test_clean_text_leaves_ordinary_text_alone_and_prometheus_uses_it_too():
    text = 'quote " backslash \\ newline \n tab \t cr \r ünï€ode 🐍'
    assert clean_text(text) == text  # the fault absent: nothing changes
    assert clean_text("lone \udc80 surrogate") == "lone ? surrogate"
    report = report_for("pcie_x8")
    report = dataclasses.replace(report, results=(dataclasses.replace(report.results[0], title=CONTROL),))
    prom = render_prometheus(report)
    assert "\x1b" not in prom and "\x00" not in prom and "\\\\x1b[31mred" in prom
