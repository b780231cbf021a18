"""The dashboard's static HTML form: a view document (``Dashboard.view()``) drawn without a
script, in the DOM and with the CSS of the live view (``frontend/dashboard.js``,
``frontend/dashboard.css``): the saved page, the ``text/html`` form beside the widget, and
what replaces the widget once the dashboard stops.
"""

from __future__ import annotations

import html
import pathlib
from collections.abc import Mapping
from typing import Any

from .dashboard_model import HISTORY, SPARK_SCALE

__all__ = ("render_html", "render_text", "FRONTEND")

FRONTEND = pathlib.Path(__file__).parent / "frontend"


def _read_css() -> str:
    return (FRONTEND / "dashboard.css").read_text(encoding="utf-8")


def _sparkline_svg(spark: Mapping[str, Any], metric: str, width: int, height: int) -> str:
    """A sparkline as inline SVG: what ``dashboard.js`` draws, without a script."""
    series = spark.get("series", [])
    size = spark.get("size", HISTORY)
    paths = []
    for index, values in enumerate(series):
        path = _spark_path(values, size, width, height)
        if path:
            paths.append(f'<path class="netq-spark-line netq-spark-{index}" d="{path}"/>')
    title = html.escape(f"last {max((len(v) for v in series), default=0)} samples, "
                        f"top {spark.get('max', '')}")
    return (f'<svg class="netq-sparkline" data-metric="{metric}" viewBox="0 0 {width} '
            f'{height}" width="{width}" height="{height}" preserveAspectRatio="none">'
            f'<title>{title}</title>{"".join(paths)}</svg>')


def _spark_path(values: list, size: int, width: int, height: int) -> str:
    """An SVG path through ``values`` (0..SPARK_SCALE; None breaks the line), newest at the
    right edge, ``size`` samples (the history window) across the width."""
    if not values:
        return ""
    step = width / max(size - 1, len(values) - 1, 1)
    start = width - step * (len(values) - 1)
    parts: list[str] = []
    pen_up = True
    for index, value in enumerate(values):
        if value is None:
            pen_up = True
            continue
        x = start + index * step
        y = height - 1 - value / SPARK_SCALE * (height - 2)
        parts.append(f"{'M' if pen_up else 'L'}{x:.1f} {y:.1f}")
        pen_up = False
    return " ".join(parts)


def render_html(view: Mapping[str, Any]) -> str:
    """A view document (``Dashboard.view()``) as HTML without a script, in the DOM the live
    view draws (``div.netq-view.netq-dashboard``, ``tr.netq-communicator``, ``tr.netq-link``,
    ``svg.netq-map``, ``.netq-stalls``), styled by the same CSS (inlined)."""
    esc = html.escape
    live = "1" if view.get("live") else "0"
    parts = [f"<style>{_read_css()}</style>",
             f'<div class="netq-view netq-dashboard" data-live="{live}">',
             '<div class="netq-title"><span class="netq-role">netq dashboard</span>',
             f'<span class="netq-badge" data-state="{esc(view.get("state", "snapshot"))}">'
             f'{esc(view.get("state_label", "snapshot"))}</span>',
             *(f'<span class="netq-fact">{esc(fact)}</span>' for fact in view.get("facts", [])),
             f'<span class="netq-uptime">{esc(view.get("clock", ""))}</span></div>']
    if view.get("snapshot"):
        parts.append(f'<div class="netq-snapshot">{esc(view["snapshot"])}</div>')
    if view.get("empty"):
        parts.append(f'<div class="netq-note">{esc(view["empty"])}</div></div>')
        return "".join(parts)
    parts.append(_map_svg(view.get("map", {})))
    parts.append(_communicators_table(view))
    parts.append(_links_table(view))
    parts.append(_stalls_html(view.get("stalls", {})))
    parts.append("</div>")
    return "".join(parts)


def _map_svg(layout: Mapping[str, Any]) -> str:
    esc = html.escape
    width, height = layout.get("width", 640), layout.get("height", 46)
    box_w, box_h = layout.get("box_w", 176), layout.get("box_h", 30)
    out = [f'<svg class="netq-map" viewBox="0 0 {width} {height}" '
           f'preserveAspectRatio="xMinYMid meet" role="img" aria-label="links">']
    for edge in layout.get("edges", []):
        out.append(f'<g class="netq-edge" data-tone="{esc(edge["tone"])}"><title>'
                   f'{esc(edge["title"])}</title><line x1="{edge["x1"]}" y1="{edge["y1"]}" '
                   f'x2="{edge["x2"]}" y2="{edge["y2"]}" stroke-width="{edge["width"]}"/>'
                   + (f'<text x="{edge["label_x"]}" y="{edge["label_y"]}">'
                      f'{esc(edge["label"])}</text>' if edge["label"] else "")
                   + '</g>')
    for node in layout.get("nodes", []):
        outside = ' data-outside="1"' if node.get("outside") else ""
        out.append(f'<g class="netq-node" data-state="{esc(node["state"])}"{outside}>'
                   f'<title>{esc(node["name"])}: {esc(node["detail"])}</title>'
                   f'<rect class="netq-node-box" x="{node["x"]}" y="{node["y"]}" '
                   f'width="{box_w}" height="{box_h}" rx="4"/>'
                   f'<rect class="netq-node-mark" x="{node["x"]}" y="{node["y"]}" width="5" '
                   f'height="{box_h}"/>'
                   f'<text class="netq-node-name" x="{node["x"] + 10}" y="{node["y"] + 12}">'
                   f'{esc(_clip(node["name"], 26))}</text>'
                   f'<text class="netq-node-detail" x="{node["x"] + 10}" '
                   f'y="{node["y"] + 25}">{esc(_clip(node["detail"], 30))}</text></g>')
    out.append("</svg>")
    return "".join(out)


NAME_CHARS = 28  # a name in a table cell (the whole name is in the cell's title)


def _clip(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters, keeping its start and its end (where workers'
    numbers usually are): ``worker-with-a-lo…-name-07``."""
    if len(text) <= limit:
        return text
    tail = min(10, limit // 3)
    return text[:limit - tail - 1] + "…" + text[len(text) - tail:]


def _bar(budget: Mapping[str, Any]) -> str:
    high = " netq-high" if budget.get("high") else ""
    return (f'<span class="netq-bar{high}"><span style="width:'
            f'{budget.get("fraction", 0) * 100:.0f}%"></span></span>'
            f'<span class="netq-bar-text">{html.escape(budget.get("text", ""))}</span>')


def _cell(text: str, small: str = "", cls: str = "") -> str:
    esc = html.escape
    klass = f' class="{cls}"' if cls else ""
    below = f'<small>{esc(small)}</small>' if small else ""
    title = f"{text} {small}".strip()
    return f'<td{klass} title="{esc(title)}"><span>{esc(text)}</span>{below}</td>'


COMMUNICATOR_HEADERS = ("communicator", "transport", "state", "peers", "in", "out",
                        "history (in, out)", "received, not taken", "memory held")
LINK_HEADERS = ("link", "state", "→", "←", "queued → / ←", "credit",
                "history (→ ←, queued)", "waiting")
# Columns a narrow view (under 860 px, e.g. marimo's default width) folds away (the CSS).
COMMUNICATOR_OPTIONAL = frozenset({1, 6})
LINK_OPTIONAL = frozenset({1})


def _header(text: str, optional: bool) -> str:
    klass = ' class="netq-optional"' if optional else ""
    return f'<th{klass} title="{html.escape(text)}">{html.escape(text)}</th>'


def _table_start(cls: str, headers: tuple[str, ...], optional: frozenset[int]) -> str:
    """A table's opening up to its body: fixed-layout columns and headers (the optional ones
    fold away in a narrow output area)."""
    return "".join(['<table class="netq-table ', cls, '"><colgroup>',
                    *(f'<col class="netq-col-{i}">' for i in range(len(headers))),
                    '</colgroup><thead><tr>',
                    *(_header(h, i in optional) for i, h in enumerate(headers)),
                    "</tr></thead><tbody>"])


def _others_row(label: str, span: int, figures: tuple[str, ...]) -> str:
    """The row that sums what a table folded: ``label`` over ``span`` columns, then the
    summed figures, then the three columns no sum fills."""
    return (f'<tr class="netq-others"><td colspan="{span}">{html.escape(label)}</td>'
            + "".join(_cell(figure, cls="netq-num") for figure in figures)
            + '<td colspan="3"></td></tr>')


def _communicators_table(view: Mapping[str, Any]) -> str:
    esc = html.escape
    parts = [_table_start("netq-communicators", COMMUNICATOR_HEADERS, COMMUNICATOR_OPTIONAL)]
    for row in view.get("communicators", []):
        note = (f'<small class="netq-row-note" title="{esc(row["note"])}">'
                f'{esc(row["note"])}</small>' if row["note"] else "")
        parts.append(
            f'<tr class="netq-communicator" data-name="{esc(row["name"])}" '
            f'data-state="{esc(row["state"])}">'
            f'<td title="{esc(row["name"])} ({esc(row["role"])}, up {esc(row["uptime"])})">'
            f'<span>{esc(_clip(row["name"], NAME_CHARS))}</span><small>{esc(row["role"])} · up '
            f'{esc(row["uptime"])}</small></td>'
            + _cell(row["transport"], row["address"], "netq-optional")
            + f'<td><span class="netq-badge" data-state="{esc(row["state"])}">'
              f'{esc(row["state_label"])}</span>{note}</td>'
            + _cell(str(row["peers"]), cls="netq-num")
            + _cell(row["in_rate"], row["in_msgs"], "netq-num")
            + _cell(row["out_rate"], row["out_msgs"], "netq-num")
            + f'<td class="netq-optional">{_sparkline_svg(row["spark"], "rate", 120, 24)}</td>'
            + f'<td>{_bar(row["received"])}</td><td>{_bar(row["memory"])}</td></tr>')
    more = view.get("communicators_more")
    if more:
        parts.append(_others_row(f'+{more["count"]} more communicators ({more["open"]} open)',
                                 4, (more["in_rate"], more["out_rate"])))
    parts.append("</tbody></table>")
    return "".join(parts)


def _links_table(view: Mapping[str, Any]) -> str:
    esc = html.escape
    rows = view.get("links", [])
    if not rows:
        return '<div class="netq-note">No links yet.</div>'
    parts = [_table_start("netq-links", LINK_HEADERS, LINK_OPTIONAL)]
    for row in rows:
        mark = "*" if row["credit_negative"] else ""
        credit_title = f' title="{esc(view.get("credit_note", ""))}"' if mark else ""
        waiting = ("-" if not row["waiting"] else
                   f'<span class="netq-reason" title="{esc(row["reason"])}">waiting '
                   f'{esc(row["waited"])}: {esc(row["reason"])}</span>')
        parts.append(
            f'<tr class="netq-link" data-link="{esc(row["key"])}" '
            f'data-waiting="{"1" if row["waiting"] else "0"}">'
            f'<td title="{esc(row["a"])} → {esc(row["b"])}">'
            f'<span>{esc(_clip(row["a"], NAME_CHARS))}</span>'
            f'<span>→ {esc(_clip(row["b"], NAME_CHARS))}'
            f'{" (other process)" if row["outside"] else ""}</span>'
            f'</td>'
            + _cell(row["state"], cls="netq-optional")
            + _cell(row["forward_rate"], f'{row["forward_msgs"]} · {row["forward_total"]}',
                    "netq-num")
            + _cell(row["back_rate"], f'{row["back_msgs"]} · {row["back_total"]}', "netq-num")
            + _cell(row["queued"], cls="netq-num")
            + f'<td class="netq-num netq-credit"{credit_title}>'
              f'<span>→ {esc(row["credit_forward"])}{mark}</span>'
              f'<small>← {esc(row["credit_back"])}</small></td>'
            + f'<td class="netq-history">{_sparkline_svg(row["spark_rate"], "rate", 90, 24)}'
              f'{_sparkline_svg(row["spark_queued"], "queued", 44, 24)}</td>'
            + f'<td class="netq-waiting-cell">{waiting}</td></tr>')
    more = view.get("links_more")
    if more:
        parts.append(_others_row(f'+{more["count"]} more links ({more["waiting"]} waiting)',
                                 2, (more["forward_rate"], more["back_rate"], more["queued"])))
    parts.append("</tbody></table>")
    if view.get("credit_note"):
        parts.append(f'<div class="netq-note netq-credit-note">* {esc(view["credit_note"])}'
                     f'</div>')
    return "".join(parts)


def _stalls_html(stalls: Mapping[str, Any]) -> str:
    esc = html.escape
    active, ended = stalls.get("active", []), stalls.get("ended", [])
    parts = ['<div class="netq-stalls">']
    if not active and not ended:
        parts.append('<div class="netq-note">No waits: every link\'s traffic flows.</div>')
    for line in active:
        parts.append(f'<details class="netq-stall" data-active="1" data-key="{esc(line["key"])}">'
                     f'<summary>'
                     f'<span class="netq-stall-head">waiting {esc(line["lasted"])} · '
                     f'{esc(line["link"])}</span><span class="netq-stall-text">'
                     f'{esc(line["reason"])}</span></summary><div class="netq-stall-full">'
                     f'since {esc(line["since"])}: {esc(line["reason"])}</div></details>')
    if stalls.get("active_more"):
        parts.append(f'<div class="netq-note">and {stalls["active_more"]} more waiting'
                     f'</div>')
    for line in ended:
        parts.append(f'<details class="netq-stall" data-active="0" data-key="{esc(line["key"])}">'
                     f'<summary>'
                     f'<span class="netq-stall-head">ended · {esc(line["since"])} for '
                     f'{esc(line["lasted"])} · {esc(line["link"])}</span>'
                     f'<span class="netq-stall-text">{esc(line["reason"])}</span></summary>'
                     f'<div class="netq-stall-full">{esc(line["reason"])}</div></details>')
    parts.append("</div>")
    return "".join(parts)


def render_text(view: Mapping[str, Any]) -> str:
    """The same view document as :func:`render_html`, as text (``text/plain``, a ``repr``):
    the badge's word and the facts, the snapshot sentence, one line per communicator row and
    per link row (the same figures), the aggregate rows and the waits. Drawn from one
    document, the two forms of a dashboard always agree."""
    lines = [f"netq dashboard ({view['state_label']}): " + ", ".join(view["facts"])]
    if view.get("snapshot"):
        lines.append(view["snapshot"])
    if view.get("empty"):
        lines.append(view["empty"])
    for row in view["communicators"]:
        lines.append(f"  {row['name']}: {row['role']} {row['transport']} {row['address']}  "
                     f"{row['state_label']}  peers {row['peers']}  "
                     f"in {row['in_msgs']} {row['in_rate']}  "
                     f"out {row['out_msgs']} {row['out_rate']}"
                     + (f"  {row['note']}" if row["note"] else ""))
    more = view.get("communicators_more")
    if more:
        lines.append(f"  +{more['count']} more communicators ({more['open']} open): "
                     f"in {more['in_rate']}, out {more['out_rate']}")
    for row in view["links"]:
        lines.append(f"  {row['a']} → {row['b']}: {row['state']}  "
                     f"→ {row['forward_msgs']} {row['forward_rate']}  "
                     f"← {row['back_msgs']} {row['back_rate']}  queued {row['queued']}")
    more = view.get("links_more")
    if more:
        lines.append(f"  +{more['count']} more links ({more['waiting']} waiting): "
                     f"→ {more['forward_rate']}, ← {more['back_rate']}, "
                     f"queued {more['queued']}")
    stalls = view["stalls"]
    lines.extend(f"  ! {stall['link']} waits since {stall['since']}: {stall['reason']}"
                 for stall in stalls["active"])
    if stalls["active_more"]:
        lines.append(f"  ! and {stalls['active_more']} more waits")
    return "\n".join(lines)
