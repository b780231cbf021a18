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
from .tables import text_table
from .view_model import monitor_view

__all__ = ("monitor_css", "monitor_html", "static_bundle")


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


def static_bundle(stats: CommunicatorStatistics,
                  names: Mapping[uuid.UUID, str] | None = None,
                  max_rows: int | None = 50) -> dict[str, str]:
    """``text/plain`` + ``text/html`` for a display without a live frontend: the text table and
    the monitor's static form (:func:`monitor_html`, a snapshot of ``stats``, no charts)."""
    return {"text/plain": text_table(stats, names, max_rows),
            "text/html": monitor_html(monitor_view(stats, names, max_rows=max_rows))}
