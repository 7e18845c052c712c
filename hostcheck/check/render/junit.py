"""--junit PATH: one testsuite per category, one testcase per check (warn passes, with its message).

The file follows Jenkins' junit-10.xsd, the schema pytest's --junitxml targets (tests/unit/fixtures/schemas
holds it; the tests validate every file against it): ``skipped`` is counted per testsuite, never on
``testsuites``, which the schema does not allow it on. Every text goes through clean_text, so a control
character in a check's message (ESC, NUL) cannot make the file stop being XML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hostcheck.check.render import clean_text
from hostcheck.registry import CATEGORIES, Status
from hostcheck.report import Report


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    el = ET.SubElement(parent, tag, {k: clean_text(v) for k, v in attrs.items()})
    if text is not None:
        el.text = clean_text(text)
    return el


def render_junit(report: Report) -> str:
    root = ET.Element("testsuites", name="hostcheck")
    root.set("tests", str(len(report.results)))
    host = report.host.get("hostname", "")
    totals = {"failures": 0, "errors": 0}
    for cat in CATEGORIES:
        rs = [r for r in report.results if r.category == cat]
        if not rs:
            continue
        suite = _el(root, "testsuite", name=f"hostcheck.{cat}", hostname=host, timestamp=report.time)
        counts = {"failures": 0, "errors": 0, "skipped": 0}
        for r in rs:
            case = _el(
                suite,
                "testcase",
                classname=f"hostcheck.{cat}",
                name=f"{r.id} {r.title}",
                time=f"{r.duration_s:.3f}",
            )
            text = r.message + (f"\nfix: {r.hint}" if r.hint else "")
            if r.details:
                text += "\n" + "\n".join(r.details)
            if r.status == Status.FAIL:
                _el(case, "failure", text, message=r.message, type="fail")
                counts["failures"] += 1
            elif r.status == Status.ERROR:
                _el(case, "error", text, message=r.message, type="error")
                counts["errors"] += 1
            elif r.status == Status.SKIP:
                _el(case, "skipped", message=r.message)
                counts["skipped"] += 1
            else:
                _el(case, "system-out", f"[{r.status.value}] {text}")
        suite.set("tests", str(len(rs)))
        for k, v in counts.items():
            suite.set(k, str(v))
            if k in totals:
                totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    props = ET.Element("properties")
    for k, v in (("score", report.verdict.score), ("ready", str(report.verdict.ready).lower())):
        ET.SubElement(props, "property", name=k, value=str(v))
    if len(root):
        root[0].insert(0, props)
    if hasattr(ET, "indent"):  # Python >= 3.9
        ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
