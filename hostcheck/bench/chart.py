"""A PNG bar chart of the median paired ratios, drawn by the one PNG engine (hostcheck.png).

:func:`chart_spec` (pure) turns the comparisons into rows; :func:`draw` draws them; :func:`render_png` writes the
file. Standard library only, in hostcheck's own process: no child, no PIL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hostcheck.outfile import write_report
from hostcheck.png import BLACK, GREY, Canvas, text_width

COLOURS = {
    "helps": (46, 139, 87),
    "hurts": (200, 55, 45),
    "no clear effect": (140, 140, 140),
    "too few pairs": (180, 180, 180),
    "finding": (230, 140, 20),
    "error": (120, 120, 120),
}


def chart_spec(comparisons: Sequence[Any], title: str, subtitle: str = "") -> dict[str, Any]:
    rows = []
    for c in comparisons:
        s = c.summary
        where = c.group.split("/", 1)[-1]
        r: dict[str, Any] = {
            "label": f"{c.tuning} | {c.b.label} | {where}",
            "verdict": c.verdict,
            "status": c.status,
        }
        if c.status == "measured" and s and s.ratio is not None:
            r.update(ratio=s.ratio, lo=s.ratio_min, hi=s.ratio_max, q1=s.ratio_q1, q3=s.ratio_q3, n=s.pairs)
            r["noisy"] = s.noisy
        elif c.status == "finding":  # the finding's sentence, without the error after it
            r["text"] = (c.message.split(": ", 1)[0] if c.message else "finding")[:100]
        else:
            r["text"] = ("error: " + (c.message or "no result"))[:100]
        rows.append(r)
    return {"title": title, "subtitle": subtitle, "rows": rows}


ROW_H, TOP, LABEL_W, PLOT_W, RIGHT = 24, 70, 420, 520, 190
#: Characters of a row's label that fit before the plot (6 pixels each in the bitmap font).
LABEL_CHARS = (LABEL_W - 24) // 6


def draw(spec: dict[str, Any]) -> bytes:
    """The chart as PNG bytes: one row per comparison, its median ratio as a bar from 1.0 on a log scale (0.5x and 2x
    lie as far from 1.0 as each other), whiskers from min to max, a thick line from Q1 to Q3."""
    rows = spec["rows"]
    width = LABEL_W + PLOT_W + RIGHT
    height = TOP + ROW_H * max(1, len(rows)) + 50
    cv = Canvas(width, height)
    cv.text(12, 10, str(spec.get("title", ""))[: (width - 24) // 12], BLACK, scale=2)
    cv.text(12, 34, str(spec.get("subtitle", ""))[: (width - 24) // 6], GREY)
    vals = [v for r in rows for v in (r.get("lo"), r.get("hi"), r.get("ratio")) if v]
    lo = min([0.5, *vals]) * 0.95
    hi = max([1.5, *vals]) * 1.05
    x0, x1 = LABEL_W, LABEL_W + PLOT_W

    def x(v: float) -> int:
        return round(x0 + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (x1 - x0))

    ticks = [1.0]
    for t in (0.9, 1.1, 0.8, 1.25, 0.67, 1.5, 0.5, 2.0, 0.33, 3.0, 0.25, 4.0, 6.0, 8.0):
        if lo <= t <= hi and all(abs(x(t) - x(k)) >= 40 for k in ticks):
            ticks.append(t)
    y_end = TOP + ROW_H * len(rows)
    for t in ticks:
        cv.line(x(t), TOP - 6, x(t), y_end, (225, 225, 225) if t != 1.0 else BLACK)
        label = f"{t:g}x"
        cv.text(x(t) - text_width(label) // 2, y_end + 6, label, (60, 60, 60))
    for i, r in enumerate(rows):
        yc = TOP + ROW_H * i + ROW_H // 2
        if i % 2:
            cv.rect(0, yc - ROW_H // 2, width - 1, yc + ROW_H // 2 - 1, (248, 248, 248))
        label = r["label"] if len(r["label"]) <= LABEL_CHARS else r["label"][: LABEL_CHARS - 1] + "~"
        cv.text(12, yc - 3, label, BLACK)
        if "ratio" in r:
            colour = COLOURS.get(r["verdict"], COLOURS["no clear effect"])
            a, b = sorted((x(1.0), x(r["ratio"])))
            cv.rect(a, yc - 7, max(b, a + 1), yc + 7, colour)
            cv.line(x(r["lo"]), yc, x(r["hi"]), yc, BLACK)
            for v in (r["lo"], r["hi"]):
                cv.line(x(v), yc - 4, x(v), yc + 4, BLACK)
            cv.rect(x(r["q1"]), yc - 1, max(x(r["q3"]), x(r["q1"]) + 1), yc + 1, BLACK)
            noisy = " (noisy)" if r.get("noisy") else ""
            cv.text(x1 + 8, yc - 3, f"{r['ratio']:.2f}x {r['verdict']}{noisy}"[: RIGHT // 6 - 2], colour)
        else:
            colour = COLOURS["finding"] if r.get("status") == "finding" else COLOURS["error"]
            cv.text(x0 + 4, yc - 3, str(r.get("text", ""))[: (PLOT_W + RIGHT) // 6 - 2], colour)
    cv.line(x(1.0), TOP - 6, x(1.0), y_end, BLACK)
    cv.text(
        12,
        y_end + 26,
        "bar: median of the paired ratios B / A (above 1: the tuning is faster); whiskers: min-max of the pairs; "
        "thick: quartiles",
        (70, 70, 70),
    )
    return cv.png()


def render_png(spec: dict[str, Any], path: str) -> str | None:
    """Write the chart to ``path``; the reason when it could not, else None."""
    try:
        write_report(path, draw(spec))
    except OSError as exc:
        return f"writing {path}: {exc.strerror or exc}"
    return None
