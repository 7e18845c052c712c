"""A PNG bar chart of the median paired ratios, drawn with PIL in the training Python.

The orchestrator builds the spec (pure, :func:`chart_spec`) and runs ``python -m hostcheck.bench.chart
SPEC.json OUT.png`` in the training Python (the core has no PIL); a missing PIL is reported, not raised.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from hostcheck.child.launch import MARKER

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


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()
    except ImportError:  # a PIL built without FreeType (pillow-simd without libfreetype-dev): the bitmap font
        return ImageFont.load_default_imagefont()


def draw(spec: dict[str, Any], path: str) -> None:
    from PIL import Image, ImageDraw

    rows = spec["rows"]
    row_h, top, label_w, plot_w, right = 30, 78, 470, 520, 170
    width = label_w + plot_w + right
    height = top + row_h * max(1, len(rows)) + 60
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    f, small, big = _font(13), _font(11), _font(17)
    d.text((12, 10), spec.get("title", ""), fill="black", font=big)
    d.text((12, 36), spec.get("subtitle", ""), fill=(70, 70, 70), font=small)
    vals = [v for r in rows for v in (r.get("lo"), r.get("hi"), r.get("ratio")) if v]
    lo = min([0.5, *vals]) * 0.95
    hi = max([1.5, *vals]) * 1.05
    x0, x1 = label_w, label_w + plot_w

    def x(v: float) -> float:
        return x0 + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (x1 - x0)

    # Log scale: 0.5x and 2x lie as far from 1.0 as each other.
    ticks = [1.0]
    for t in (0.9, 1.1, 0.8, 1.25, 0.67, 1.5, 0.5, 2.0, 0.33, 3.0, 0.25, 4.0, 6.0, 8.0):
        if lo <= t <= hi and all(abs(x(t) - x(k)) >= 40 for k in ticks):
            ticks.append(t)
    y_end = top + row_h * len(rows)
    for t in ticks:
        d.line([(x(t), top - 6), (x(t), y_end)], fill=(225, 225, 225) if t != 1.0 else (0, 0, 0), width=1)
        d.text((x(t) - 12, y_end + 6), f"{t:g}x", fill=(60, 60, 60), font=small)
    for i, r in enumerate(rows):
        yc = top + row_h * i + row_h // 2
        if i % 2:
            d.rectangle([(0, yc - row_h // 2), (width, yc + row_h // 2 - 1)], fill=(248, 248, 248))
        label = r["label"] if len(r["label"]) <= 66 else r["label"][:65] + "~"
        d.text((12, yc - 8), label, fill="black", font=f)
        if "ratio" in r:
            colour = COLOURS.get(r["verdict"], COLOURS["no clear effect"])
            a, b = sorted((x(1.0), x(r["ratio"])))
            d.rectangle([(a, yc - 8), (max(b, a + 1), yc + 8)], fill=colour)
            d.line([(x(r["lo"]), yc), (x(r["hi"]), yc)], fill="black", width=1)
            for v in (r["lo"], r["hi"]):
                d.line([(x(v), yc - 5), (x(v), yc + 5)], fill="black", width=1)
            d.line([(x(r["q1"]), yc), (max(x(r["q3"]), x(r["q1"]) + 1), yc)], fill="black", width=4)
            noisy = " (noisy)" if r.get("noisy") else ""
            d.text((x1 + 8, yc - 8), f"{r['ratio']:.2f}x {r['verdict']}{noisy}", fill=colour, font=small)
        else:
            colour = COLOURS["finding"] if r.get("status") == "finding" else COLOURS["error"]
            d.text((x0 + 4, yc - 8), r.get("text", ""), fill=colour, font=small)
    d.line([(x(1.0), top - 6), (x(1.0), y_end)], fill="black", width=1)
    d.text(
        (12, y_end + 26),
        "bar: median of the paired ratios B / A (above 1: the tuning is faster); whiskers: min-max of the pairs; "
        "thick: quartiles",
        fill=(70, 70, 70),
        font=small,
    )
    img.save(path, "PNG")


def render_png(ctx: Any, spec: dict[str, Any], path: str) -> str | None:
    """Draw in the training Python (a child); the reason when it could not, else None."""
    from hostcheck.bench.run import variant_env

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    try:
        argv = [ctx.python, "-m", "hostcheck.bench.chart", spec_path, os.path.abspath(path)]
        run = ctx.launcher(argv, variant_env(ctx), 120.0, "chart")
    finally:
        os.unlink(spec_path)
    final = next((r for r in reversed(run.records) if "ok" in r), {})
    if run.error or not final.get("ok"):
        return str(final.get("error") or run.error)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        sys.stderr.write("usage: python -m hostcheck.bench.chart SPEC.json OUT.png\n")
        return 2
    try:
        with open(argv[0]) as f:
            spec = json.load(f)
        try:
            import PIL  # noqa: F401
        except ImportError as exc:
            rec = {"ok": False, "error": f"no PIL in this Python ({exc}): chart not drawn"}
        else:
            draw(spec, argv[1])
            rec = {"ok": True, "path": argv[1]}
    except Exception as exc:
        rec = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(MARKER + json.dumps(rec) + "\n")
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
