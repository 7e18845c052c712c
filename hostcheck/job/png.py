"""The timeline picture of ``hostcheck job``, drawn with the one PNG engine (hostcheck.png).

Two panels over time: data wait and GPU busy (%), and the CPU cores of the training processes and of their
DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hostcheck.png import (
    BLACK,
    BLUE,
    GREEN,
    GREY,
    GRID,
    ORANGE,
    RED,
    RED_FILL,
    Canvas,
    text_width,
)


def _ticks(hi: float, want: int = 6) -> list[float]:
    """Round tick values from 0 to about ``hi``."""
    if hi <= 0:
        return [0.0]
    raw = hi / want
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    while mag > raw:
        mag /= 10
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, v = [], 0.0
    while v <= hi + 1e-9:
        out.append(round(v, 6))
        v += step
    return out


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-6 else f"{v:.1f}"


class _Panel:
    def __init__(self, cv: Canvas, x0: int, y0: int, x1: int, y1: int, t_max: float, y_max: float) -> None:
        self.cv, self.x0, self.y0, self.x1, self.y1 = cv, x0, y0, x1, y1
        self.t_max, self.y_max = max(t_max, 1e-6), max(y_max, 1e-6)

    def x(self, t: float) -> int:
        return round(self.x0 + (self.x1 - self.x0) * min(max(t / self.t_max, 0.0), 1.0))

    def y(self, v: float) -> int:
        return round(self.y1 - (self.y1 - self.y0) * min(max(v / self.y_max, 0.0), 1.0))

    def frame(self, y_ticks: Sequence[float], x_ticks: Sequence[float], unit: str, x_labels: bool) -> None:
        cv = self.cv
        for v in y_ticks:
            cv.line(self.x0, self.y(v), self.x1, self.y(v), GRID)
            label = _fmt(v) + unit
            cv.text(self.x0 - 6 - text_width(label), self.y(v) - 3, label, GREY)
        for t in x_ticks:
            cv.line(self.x(t), self.y0, self.x(t), self.y1, GRID)
            if x_labels:
                label = _fmt(t)
                cv.text(self.x(t) - text_width(label) // 2, self.y1 + 6, label, GREY)
        cv.line(self.x0, self.y1, self.x1, self.y1, BLACK)
        cv.line(self.x0, self.y0, self.x0, self.y1, BLACK)

    def bars(self, values: Sequence[float | None], width_s: float, fill: Any, top: Any) -> None:
        for k, v in enumerate(values):
            if v is None:
                continue
            xa, xb = self.x(k * width_s), self.x((k + 1) * width_s) - 1
            self.cv.rect(xa, self.y(v), max(xa, xb), self.y1 - 1, fill)
            self.cv.line(xa, self.y(v), max(xa, xb), self.y(v), top)

    def series(self, points: Sequence[tuple[float, float | None]], colour: Any, width: int = 2) -> None:
        """A line through (t, value) points; None breaks it."""
        prev = None
        for t, v in points:
            if v is None:
                prev = None
                continue
            pt = (self.x(t), self.y(v))
            if prev is not None:
                self.cv.line(prev[0], prev[1], pt[0], pt[1], colour, width)
            else:
                self.cv.rect(pt[0] - 1, pt[1] - 1, pt[0] + 1, pt[1] + 1, colour)
            prev = pt


def _legend(cv: Canvas, x: int, y: int, items: Sequence[tuple[str, Any]]) -> None:
    for label, colour in items:
        cv.rect(x, y, x + 11, y + 6, colour)
        x = cv.text(x + 16, y, label, BLACK) + 14


WIDTH, HEIGHT = 960, 500


def _gpu_label(signal: Any) -> str:
    """The green line's name says which signal it is (utilisation is only the share of time a kernel ran)."""
    if isinstance(signal, str) and signal.startswith("sm-activity"):
        return "GPU SM activity % (DCGM profiling)" if "DCGM" in signal else "GPU SM activity % (NVML GPM)"
    return "GPU utilisation % (kernel time, not SM activity)"


def draw_timeline(timeline: dict[str, Any], title: str, subtitle: str, gpu_note: str = "") -> bytes:
    """The picture: title, a panel of data wait and GPU busy (%), a panel of CPU cores, over seconds since the
    job started."""
    cv = Canvas(WIDTH, HEIGHT)
    cv.text(16, 12, title[:70], BLACK, scale=2)
    cv.text(16, 36, subtitle[:150], GREY)
    width_s = float(timeline.get("bin_s") or 1.0)
    wait = timeline.get("wait_pct") or []
    gpu = [(float(t), v) for t, v in timeline.get("gpu") or []]
    main = [(float(t), m) for t, m, _w in timeline.get("cpu") or []]
    workers = [(float(t), w) for t, _m, w in timeline.get("cpu") or []]
    t_max = float(timeline.get("duration_s") or max(len(wait) * width_s, 1.0))
    x_ticks = _ticks(t_max, 10)
    left, right = 70, WIDTH - 24
    top = _Panel(cv, left, 80, right, 290, t_max, 100.0)
    top.frame([0, 25, 50, 75, 100], x_ticks, "%", x_labels=False)
    top.bars(wait, width_s, RED_FILL, RED)
    has_gpu = bool(gpu)
    if has_gpu:
        top.series(gpu, GREEN, 2)
    items = [("data wait (% of the bin, training processes)", RED)]
    items.append(
        (
            _gpu_label(timeline.get("gpu_signal"))
            if has_gpu
            else f"GPU busy: {gpu_note or 'no GPU figures'}",
            GREEN if has_gpu else GREY,
        )
    )
    _legend(cv, left, 62, items)
    cores = float(timeline.get("cores") or 1)
    peak = max([v for _t, v in (*main, *workers) if v is not None] or [0.0])
    y_max = max(cores, peak)
    bottom = _Panel(cv, left, 340, right, 450, t_max, y_max)
    bottom.frame(_ticks(y_max, 4), x_ticks, "", x_labels=True)
    bottom.series(main, BLUE, 2)
    bottom.series(workers, ORANGE, 2)
    bottom.cv.line(left, bottom.y(cores), right, bottom.y(cores), GREY)
    _legend(cv, left, 322, [("CPU cores: training processes", BLUE), ("DataLoader workers", ORANGE)])
    cv.text(right - text_width(f"{cores:g} cores"), bottom.y(cores) - 10, f"{cores:g} cores", GREY)
    label = "seconds since the job started"
    cv.text((left + right) // 2 - text_width(label) // 2, 474, label, GREY)
    return cv.png()
