"""The static form of a monitor: its view model (:mod:`netq.display.view_model`) and charts
(:mod:`netq.display.charts`) as HTML without script, with the shipped stylesheet inlined.

What a display without a live frontend shows (GitHub, nbviewer, an executed notebook, a stopped
view's place) and what a live widget leaves behind when it stops.
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Mapping
from typing import Any

from ..statistics import CommunicatorStatistics
from .charts import chart_svg
from .tables import COLUMNS, NAME_WIDTH
from .view_model import monitor_view

__all__ = ("monitor_css", "monitor_html", "monitor_text", "static_bundle")

_WIDTHS = {"peer": NAME_WIDTH, **{column.key: column.width for column in COLUMNS}}


def monitor_css() -> str:
    """The monitor's stylesheet (``widgets/frontend/monitor.css``, shipped in the package): the
    live widget loads it as its CSS, the static form inlines it. Empty if it is missing."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("netq.widgets")  # finds, does not import, netq.widgets
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    for folder in spec.submodule_search_locations:
        try:
            with open(f"{folder}/frontend/monitor.css", encoding="utf-8") as css:
                return css.read()
        except OSError:
            continue
    return ""


def monitor_html(view: Mapping[str, Any], frame: Mapping[str, Any] | None = None,
                 times: list[float] | None = None, series: Mapping[str, list] | None = None,
                 *, style: bool = True) -> str:
    """The static form of a monitor (:func:`~netq.display.view_model.monitor_view`, plus the
    charts of ``frame`` over ``times`` and ``series`` when given): the live view's DOM without
    script, ``data-live="0"`` with its ``.netq-snapshot`` sentence. Every text is escaped."""
    escape = html.escape
    title = view["title"]
    live = "1" if view["live"] else "0"
    parts = [f"<style>{monitor_css()}</style>" if style else "",
             f'<div class="netq-view netq-monitor" data-live="{live}">',
             '<div class="netq-title">',
             f'<span class="netq-role">{escape(title["role"])}</span>',
             f'<span class="netq-address">{escape(title["address"])}</span>',
             f'<span class="netq-badge" data-state="{escape(title["state"])}">'
             f'{escape(title["label"])}</span>',
             f'<span class="netq-uptime">{escape(title["uptime"])}</span>']
    parts.extend(f'<span class="netq-fact">{escape(fact)}</span>' for fact in title["facts"])
    parts.extend(f'<span class="netq-alert">{escape(alert)}</span>' for alert in title["alerts"])
    parts.append("</div>")
    if view["snapshot"]:
        parts.append(f'<div class="netq-snapshot">{escape(view["snapshot"])}</div>')
    if frame is not None and times and series is not None and frame["plotted"]:
        parts.append('<div class="netq-charts">')
        for chart in frame["charts"]:
            parts.append(f'<div class="netq-chart-box"><div class="netq-chart-title">'
                         f'{escape(chart["title"])}</div>'
                         f'{chart_svg(chart, frame, times, series)}</div>')
        parts.append('</div><div class="netq-legend">')
        parts.extend(f'<span class="netq-legend-entry" data-peer="{escape(entry["peer"])}">'
                     f'<span class="netq-swatch" style="background:{entry["colour"]}"></span>'
                     f'{escape(entry["label"])}</span>' for entry in frame["plotted"])
        parts.append("</div>")
    parts.append('<div class="netq-table-box"><table class="netq-peers"><thead><tr>')
    parts.extend(f'<th data-sort="{key}" class="{"netq-num" if numeric else "netq-text"}">'
                 f'{escape(header)}</th>' for key, header, numeric in view["columns"])
    parts.append("</tr></thead><tbody>")
    keys = [key for key, _, _ in view["columns"]]
    notes = view["notes"]

    def cells(texts: list[str], marks: Mapping[str, str] | None = None,
              swatch: str = "") -> str:
        out = []
        for key, text in zip(keys, texts, strict=True):
            mark = (marks or {}).get(key)
            note = (f'<sup class="netq-mark" title="{escape(notes.get(mark, ""))}">*</sup>'
                    if mark else "")
            out.append(f'<td data-key="{key}">{swatch if key == "peer" else ""}'
                       f'{escape(text)}{note}</td>')
        return "".join(out)

    for row in view["rows"]:
        blocked = (f' title="{escape(row["blocked"])}"', " netq-blocked") if row["blocked"] \
            else ("", "")
        swatch = (f'<span class="netq-swatch" style="background:{row["colour"]}"></span>'
                  if row["colour"] else "")
        parts.append(f'<tr class="netq-peer{blocked[1]}" data-peer="{escape(row["peer"])}"'
                     f'{blocked[0]}>{cells(row["cells"], row["marks"], swatch)}</tr>')
    if view["others"]:
        parts.append(f'<tr class="netq-others">{cells(view["others"]["cells"])}</tr>')
    parts.append(f'<tr class="netq-total">{cells(view["total"])}</tr></tbody></table></div>')
    if view["waiting"]:
        parts.append('<ul class="netq-waiting">')
        parts.extend(f"<li>{escape(text)}</li>" for text in view["waiting"])
        parts.append("</ul>")
    if notes:
        parts.append('<div class="netq-notes">')
        parts.extend(f'<div class="netq-note">* {escape(text)}</div>' for text in notes.values())
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def monitor_text(view: Mapping[str, Any]) -> str:
    """The same view model as :func:`monitor_html`, as fixed-width text (``text/plain``, a
    ``repr``): the title line with the badge's word and the same facts, the snapshot sentence,
    the same rows (busiest first), the ``others`` and total rows, the waits and footnotes. The
    two forms of one view always agree: they are drawn from one document."""
    title = view["title"]
    lines = ["  ".join([f"{title['role']} on {title['address']}", title["label"],
                        title["uptime"], *title["facts"], *title["alerts"]])]
    if view["snapshot"]:
        lines.append(view["snapshot"])
    keys = [key for key, _, _ in view["columns"]]

    def line(texts: list[str]) -> str:
        cells = []
        for key, text in zip(keys, texts, strict=True):
            width = _WIDTHS.get(key, len(text))
            cells.append(f"{text[:width]:<{width}}" if key in ("peer", "state")
                         else f"{text:>{width}}")
        return " ".join(cells).rstrip()

    lines.append(line([header for _, header, _ in view["columns"]]))
    lines.extend(line(row["cells"]) for row in view["rows"])
    others = view["others"]
    if others:  # its label does not fit the name column: the count at the end of its line
        lines.append(f"{line(['others', *others['cells'][1:]])}  ({others['count']} peers)")
    lines.append(line(view["total"]))
    lines.extend(f"! {text}" for text in view["waiting"])
    lines.extend(f"* {text}" for text in view["notes"].values())
    return "\n".join(lines)


def static_bundle(stats: CommunicatorStatistics,
                  names: Mapping[uuid.UUID, str] | None = None,
                  max_rows: int | None = 50) -> dict[str, str]:
    """``text/plain`` + ``text/html`` for a display without a live frontend: one snapshot of
    ``stats`` (:func:`~netq.display.view_model.monitor_view`, no charts) drawn as text
    (:func:`monitor_text`) and as the monitor's static form (:func:`monitor_html`)."""
    view = monitor_view(stats, names, max_rows=max_rows)
    return {"text/plain": monitor_text(view), "text/html": monitor_html(view)}
