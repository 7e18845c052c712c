"""--junit PATH: one testsuite per category, one testcase per check (warn passes, with its message)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hostcheck.registry import CATEGORIES, Status
from hostcheck.report import Report


def render_junit(report: Report) -> str:
    root = ET.Element("testsuites", name="hostcheck")
    root.set("tests", str(len(report.results)))
    host = report.host.get("hostname", "")
    totals = {"failures": 0, "errors": 0, "skipped": 0}
    for cat in CATEGORIES:
        rs = [r for r in report.results if r.category == cat]
        if not rs:
            continue
        suite = ET.SubElement(
            root, "testsuite", name=f"hostcheck.{cat}", hostname=host, timestamp=report.time
        )
        counts = {"failures": 0, "errors": 0, "skipped": 0}
        for r in rs:
            case = ET.SubElement(
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
                ET.SubElement(case, "failure", message=r.message, type="fail").text = text
                counts["failures"] += 1
            elif r.status == Status.ERROR:
                ET.SubElement(case, "error", message=r.message, type="error").text = text
                counts["errors"] += 1
            elif r.status == Status.SKIP:
                ET.SubElement(case, "skipped", message=r.message)
                counts["skipped"] += 1
            else:
                ET.SubElement(case, "system-out").text = f"[{r.status.value}] {text}"
        suite.set("tests", str(len(rs)))
        for k, v in counts.items():
            suite.set(k, str(v))
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
