"""Human report, for a person at a terminal: what is wrong in full with its fix, the rest folded.

- wrapped to the terminal's width (COLUMNS, else the terminal's size; 100 when not a terminal);
- every failure, error and warning with its message and its fix, worst first;
- the checks that passed as one line per category, the skips as one line with their count and commonest reasons;
- what is the same on several GPUs, ports or items said once: "GPU 0-7: PCIe x8" (:func:`fold`);
- ``--verbose``: every check with its message and details, by category.

Every text that came from the node (device names, tool output, messages) is shown with its control characters
escaped (:func:`hostcheck.check.render.visible`): a name cannot forge a report line or a terminal escape. Colour
only when asked (the command line decides: a TTY and NO_COLOR unset, or --color always).
"""

from __future__ import annotations

import os
import re
import textwrap
from collections import Counter
from typing import Any

from hostcheck.check.render import visible
from hostcheck.profiles import PROFILES
from hostcheck.registry import CATEGORIES, Result, Status
from hostcheck.report import Report

_COLOURS = {
    Status.PASS: "\033[32m",
    Status.WARN: "\033[33m",
    Status.FAIL: "\033[31m",
    Status.ERROR: "\033[35m",
    Status.SKIP: "\033[2m",
}
_RESET = "\033[0m"
_BOLD = "\033[1m"
#: The width when the output is no terminal and COLUMNS is unset (a log, a pipe, a file).
DEFAULT_WIDTH = 100
#: Narrower than this, a fix cannot be read whatever the wrapping: the report is wrapped at this width instead.
MIN_WIDTH = 40
#: Skip reasons named on the skip line; the rest are counted (--verbose lists every skip).
SKIP_REASONS_SHOWN = 3
#: The status column: five characters and two spaces ("ERROR  ").
_STATUS_W = 7
#: What a shorter profile leaves out, by the gatherer it does not run.
_LEFT_OUT = {"workload": "the GPU workload", "torch": "the torch probe", "datapath": "the dataset reads"}


def terminal_width(stream: Any = None, environ: Any = None) -> int:
    """The width to wrap at: COLUMNS when set to a number, else the size of the terminal ``stream`` writes to,
    else DEFAULT_WIDTH (not a terminal); never below MIN_WIDTH."""
    env = os.environ if environ is None else environ
    columns = str(env.get("COLUMNS", "")).strip()
    width = int(columns) if columns.isascii() and columns.isdigit() else 0
    if not width and stream is not None:
        try:
            if stream.isatty():
                width = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # closed, not a file, or no size
            width = 0
    return max(MIN_WIDTH, min(width or DEFAULT_WIDTH, 1000))


# ------------------------------------------------------------------------------------------------ folding

#: "GPU 3: text", "mlx5_2 port 1: text", "mc1: text": a head naming one item (a number in it), then what is said.
_ITEM = re.compile(r"(?P<head>[^:;]{0,60}?\d[^:;]{0,40}?): (?P<text>.+)", re.DOTALL)
_NUMBER = re.compile(r"\d+", re.ASCII)


def _spans(numbers: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 3, 5, 7, 8] -> [(0, 3), (5, 5), (7, 8)]."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return [(s[0], s[1]) for s in spans]


def _runs(numbers: list[int], word: str = "") -> str:
    """[0, 1, 2, 3, 5] -> "0-3, 5"; with ``word`` (a name the number is glued to, "mc", "mlx5_"): "mc0-mc3, mc5"."""
    return ", ".join(f"{word}{a}" if a == b else f"{word}{a}-{word}{b}" for a, b in _spans(numbers))


def fold(parts: list[str]) -> list[str]:
    """The parts (a message's ``; `` pieces, or detail lines) with the items that say the same thing said once:
    ["GPU 0: x8", "GPU 1: x8", "GPU 3: x16"] -> ["GPU 0-1: x8", "GPU 3: x16"]. Items fold when their heads differ
    in one number only ("GPU 2", "mlx5_2 port 1") and their text is the same; the order of first appearance stays."""
    groups: dict[tuple, list[tuple[int, list[str]]]] = {}
    order: list[tuple] = []
    for i, part in enumerate(parts):
        m = _ITEM.fullmatch(part)
        if m:
            head = m.group("head")
            numbers = _NUMBER.findall(head)
            # NUL stands for each number: the parts were made visible, so none holds a NUL of its own.
            key: tuple = ("item", _NUMBER.sub("\0", head), m.group("text"), len(numbers))
            entry = (i, numbers)
        else:
            key, entry = ("plain", i), (i, [])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(entry)
    out = []
    for key in order:
        members = groups[key]
        if key[0] == "plain":
            out.append(parts[members[0][0]])
            continue
        out.extend(_fold_items(parts, key, members))
    return out


def _fold_items(parts: list[str], key: tuple, members: list[tuple[int, list[str]]]) -> list[str]:
    """One group of items with the same text: said once when their heads differ in one number, else each."""
    if len(members) == 1:
        return [parts[members[0][0]]]
    heads = [m[1] for m in members]
    differ = [j for j in range(key[3]) if len({h[j] for h in heads}) > 1]
    if not differ:  # the same item twice
        return [parts[members[0][0]]]
    if len(differ) > 1:
        return [parts[m[0]] for m in members]
    j, pieces = differ[0], key[1].split("\0")
    numbers = heads[0]
    before = "".join(pieces[k] + numbers[k] for k in range(j)) + pieces[j]
    after = "".join(pieces[k] + (numbers[k] if k < len(numbers) else "") for k in range(j + 1, len(pieces)))
    varying = [int(h[j]) for h in heads]
    if not before or before[-1] == " ":  # "GPU 3": the numbers alone, "GPU 0-7"
        return [f"{before}{_runs(varying)}{after}: {key[2]}"]
    # "mc3", "mlx5_3": the name the number is glued to comes with each, "mc0-mc3"
    word = re.search(r"\S+$", before).group()
    return [f"{before[: -len(word)]}{_runs(varying, word)}{after}: {key[2]}"]


def fold_message(message: str) -> str:
    """A message with what several items share said once (``; `` separates its parts)."""
    return "; ".join(fold(message.split("; ")))


# ------------------------------------------------------------------------------------------------ the report


class _Writer:
    """Lines wrapped to one width, with a hanging indent; colour applied after wrapping (it takes no width)."""

    def __init__(self, width: int, colour: bool) -> None:
        self.width, self.colour, self.lines = width, colour, []

    def paint(self, code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if self.colour else text

    def add(
        self, text: str, indent: int = 0, hang: int | None = None, lead: str = "", lead_code: str = ""
    ) -> None:
        """``lead`` (a status word, painted with ``lead_code``) then ``text``, wrapped; later lines indented by
        ``hang`` (default: where the text starts)."""
        start = " " * indent + lead
        if (
            len(start) > self.width // 2
        ):  # a lead that long (a hostname of 200 characters) is text, wrapped too
            text, lead, start = f"{lead}{text}", "", " " * indent
        hang = len(start) if hang is None else min(hang, self.width // 2)
        wrapped = textwrap.wrap(
            text,
            width=self.width,
            initial_indent=start,
            subsequent_indent=" " * hang,
            break_long_words=True,
            break_on_hyphens=False,
        ) or [start.rstrip()]
        if lead and lead_code:
            wrapped[0] = (
                " " * indent + self.paint(lead_code, lead.rstrip()) + wrapped[0][len(start.rstrip()) :]
            )
        self.lines.extend(wrapped)

    def blank(self) -> None:
        if self.lines and self.lines[-1]:
            self.lines.append("")


def render_text(
    report: Report, colour: bool = False, verbose: bool = False, width: int = DEFAULT_WIDTH
) -> str:
    w = _Writer(max(MIN_WIDTH, width), colour)
    _header(w, report)
    if verbose:
        _every_check(w, report)
    else:
        _findings(w, report)
        _folded(w, report)
    _footer(w, report, verbose)
    return "\n".join(w.lines) + "\n"


def _header(w: _Writer, report: Report) -> None:
    h, v = report.host, report.versions
    profile = f", profile {visible(report.profile)}" if report.profile else ""
    head = f"hostcheck {visible(v.get('hostcheck', ''))} on {visible(h.get('hostname', '?'))}"
    w.add(f"{report.time}, {report.duration_s:.1f} s{profile}", lead=head + "  ", lead_code=_BOLD)
    w.add(
        visible(
            f"{h.get('os', '?')}, kernel {h.get('kernel', '?')}; driver {v.get('driver') or 'none'}"
            f" (CUDA {v.get('driver_cuda') or '-'}); torch {v.get('torch') or 'none'}"
            f" (CUDA {v.get('torch_cuda') or '-'}) in {v.get('training_python') or '(not probed)'}"
        ),
        indent=2,
        hang=4,
    )
    left = left_out(report.profile)
    if left:
        w.add(f"the {report.profile} profile leaves out {left}: --profile full runs them", indent=2, hang=4)


def left_out(name: str) -> str:
    """What the profile ``name`` does not run that ``full`` does, in words ("" when nothing)."""
    p, full = PROFILES.get(name), PROFILES["full"]
    if p is None:
        return ""
    parts = [words for need, words in _LEFT_OUT.items() if need in full.needs - p.needs]
    if p.dcgm_level < full.dcgm_level:
        parts.append(f"DCGM's level-{full.dcgm_level} diagnostic")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] if parts else ""


def _finding(w: _Writer, r: Result, indent: int, details: bool) -> None:
    """One check: status, id, title and message (folded), then its fix when it falls short, then its details."""
    lead = f"{r.status.value.upper():{_STATUS_W}}"
    body = f"{r.id}  {visible(r.title)}: {fold_message(visible(r.message))}"
    w.add(body, indent=indent, hang=indent + _STATUS_W, lead=lead, lead_code=_COLOURS[r.status])
    if r.status.severity > 0 and r.hint:
        w.add(visible(r.hint), indent=indent + _STATUS_W, hang=indent + _STATUS_W + 5, lead="fix: ")
    if details and r.details:
        for d in fold([visible(x) for x in r.details]):
            w.add(d, indent=indent + _STATUS_W + 2, hang=indent + _STATUS_W + 4)


def _worst_first(results: tuple[Result, ...]) -> list[Result]:
    rank = {Status.ERROR: 0, Status.FAIL: 0, Status.WARN: 1}
    return sorted((r for r in results if r.status in rank), key=lambda r: rank[r.status])


def _findings(w: _Writer, report: Report) -> None:
    found = _worst_first(report.results)
    if found:
        w.blank()
    for r in found:
        _finding(w, r, 0, details=False)


def _ids(rs: list[Result]) -> str:
    """The checks' numbers in a category, in runs: "E001-E004, E006"."""
    numbers = [int(r.id.split(".E", 1)[1]) for r in rs if r.id.split(".E", 1)[-1].isdigit()]
    return re.sub(r"(\d+)", lambda m: f"E{int(m.group(1)):03d}", _runs(numbers)) if numbers else ""


def _folded(w: _Writer, report: Report) -> None:
    """The passes, one line per category; the skips, one line with their count and commonest reasons."""
    w.blank()
    width = max((len(c) for c in CATEGORIES), default=8)
    for cat in CATEGORIES:
        rs = [r for r in report.results if r.category == cat and r.status is Status.PASS]
        if rs:
            what = f"{cat + ':':{width + 1}} {len(rs)} check{'s' if len(rs) > 1 else ''} ({_ids(rs)})"
            w.add(
                what,
                hang=_STATUS_W + width + 2,
                lead=f"{'PASS':{_STATUS_W}}",
                lead_code=_COLOURS[Status.PASS],
            )
    skips = [r for r in report.results if r.status is Status.SKIP]
    if skips:
        reasons = Counter(visible(r.message) for r in skips).most_common()
        # One reason more than the limit is said itself: "1 other reason" would take as much room.
        count = len(reasons) if len(reasons) <= SKIP_REASONS_SHOWN + 1 else SKIP_REASONS_SHOWN
        shown = "; ".join(f"{why} ({n})" for why, n in reasons[:count])
        more = len(reasons) - count
        tail = (
            f"; {more} other reason{'s' if more > 1 else ''} (--verbose lists every check)"
            if more > 0
            else ""
        )
        lead = f"{'SKIP':{_STATUS_W}}"
        w.add(
            f"{len(skips)} check{'s' if len(skips) > 1 else ''} not run: {shown}{tail}",
            lead=lead,
            lead_code=_COLOURS[Status.SKIP],
        )


def _every_check(w: _Writer, report: Report) -> None:
    for cat in CATEGORIES:
        rs = [r for r in report.results if r.category == cat]
        if not rs:
            continue
        w.blank()
        w.add(w.paint(_BOLD, cat.upper()))
        for r in rs:
            _finding(w, r, 2, details=True)


def _footer(w: _Writer, report: Report, verbose: bool) -> None:
    vd = report.verdict
    counts = ", ".join(f"{n} {k}" for k, n in vd.counts.items() if n)
    state = (
        w.paint(_COLOURS[Status.PASS], "READY") if vd.ready else w.paint(_COLOURS[Status.FAIL], "NOT READY")
    )
    score = "n/a" if vd.score is None else f"{vd.score}/100"
    w.blank()
    w.lines.append(w.paint(_BOLD, f"score {score}") + "  " + state)
    w.add(f"fail level {vd.fail_level}, min score {vd.min_score}; {counts}", indent=2, hang=4)
    if not vd.top_fixes:
        return
    if verbose:
        w.add("top fixes:")
        for i, (cid, hint) in enumerate(vd.top_fixes, 1):
            w.add(visible(hint), indent=2, lead=f"{i}. [{cid}] ", hang=4)
    else:
        w.add(", ".join(fix[0] for fix in vd.top_fixes) + " (their fixes above)", lead="fix first: ", hang=4)


def render_list(checks: list) -> str:
    lines = [f"{'ID':14} {'CATEGORY':9} {'WEIGHT':>6}  TITLE"]
    for ch in checks:
        lines.append(f"{ch.id:14} {ch.category:9} {ch.weight:>6g}  {ch.title}")
    return "\n".join(lines) + "\n"
