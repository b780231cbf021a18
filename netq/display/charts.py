"""Display fields of a statistics snapshot: the one place that turns a ``PeerStatistics`` into
what people read, shared by the terminal demo (``python -m netq demo``), the static text/HTML
summary and the live Jupyter widget (``netq.widgets``).

Standard library only: the core package and the demo need none of the widget dependencies.

* :data:`COLUMNS` lists the per-peer columns in display order (key, header, unit).
* :func:`peer_values` gives the numbers behind them (what the widget plots),
  :func:`peer_fields` the same row as formatted strings (what the tables show).
* :func:`text_table` renders a whole :class:`CommunicatorStatistics` as text,
  :func:`monitor_view` / :func:`monitor_html` as the monitor's view model and static HTML.
"""

from __future__ import annotations

import html
import math
import re
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .diagnostics import format_bytes
from .statistics import CommunicatorStatistics, PeerStatistics

__all__ = ("Column", "COLUMNS", "PALETTE", "peer_name", "with_names", "peer_values", "peer_fields",
           "format_count", "format_rate", "format_bytes", "format_byte_rate", "format_address",
           "format_duration", "format_uptime", "text_table", "header_line",
           "title_state", "static_bundle", "in_kernel", "StaticSummary", "monitor",
           "communicator_bundle", "communicator_display", "communicator_marimo", "environment",
           "environment_line",
           "PEER_COLOURS", "NEGATIVE_CREDIT", "LIVE_STATES", "STATIC_STATES", "SAMPLE",
           "Chart", "CHARTS", "busiest_first", "peer_sample", "badge_state",
           "snapshot_sentence", "monitor_view", "format_tick_bytes", "axis_ticks",
           "time_axis", "chart_frame", "monitor_css", "chart_svg", "monitor_html")

# One unit convention everywhere: binary (KiB = 1024 B, MiB = 1024 KiB), for memory, credit
# and rates alike (MiB/s), so that a rate and a budget can be compared at a glance.
MiB = float(1 << 20)
# One colour per peer, in the order peers are first plotted (matplotlib's / bokeh's Category10);
# the table's swatches, the live plots and the static charts use the same one.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def format_count(value: float) -> str:
    """A message count or rate with a k/M/G suffix: ``950``, ``12.3k``, ``1.20M``."""
    value = float(value)
    if value != value:  # NaN
        return "-"
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            number = value / scale
            return f"{number:.2f}{suffix}" if abs(number) < 10 else f"{number:.1f}{suffix}"
    return f"{value:.0f}"


def format_rate(value: float) -> str:
    """A rate already divided by its unit (MiB/s), two significant decimals near zero."""
    value = float(value)
    if value != value:
        return "-"
    if value == 0:
        return "0"
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def format_byte_rate(value: float) -> str:
    """Bytes per second, auto-scaled: ``0 B/s``, ``512 B/s``, ``2.38 MiB/s``."""
    return f"{format_bytes(value)}/s" if value == value else "-"


def format_address(address: object) -> str:
    """An address as people write it: ``127.0.0.1:44503``, ``[::1]:80``, a Unix socket's path.

    Accepts what transports report: a ``(host, port[, flow, scope])`` tuple, its ``str()``
    (``"('127.0.0.1', 44503)"``), a path, or any other text (returned as is).
    """
    if address is None or address in ("None", ""):
        return "-"  # not bound or connected (yet, or any more)
    if isinstance(address, str):
        match = _TUPLE.fullmatch(address.strip())
        if match is None:
            return address
        host, port = match.group(1), int(match.group(2))
    elif isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), int(address[1])
    else:
        return str(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_TUPLE = re.compile(r"\(\s*'([^']*)'\s*,\s*(\d+)\s*(?:,[^)]*)?\)")


def format_duration(seconds: float) -> str:
    """``4.2 s``, ``3 min 12 s``, ``2 h 05 min``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def format_uptime(seconds: float) -> str:
    """A clock that moves at every 2 Hz sample: ``4.2 s``, ``3 min 12.5 s``, ``2 h 05 min 12.5 s``
    (:func:`format_duration` rounds to whole seconds and minutes past the first minute)."""
    seconds = round(max(0.0, float(seconds)), 1)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes:.0f} min {rest:04.1f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours:.0f} h {minutes:02.0f} min {rest:04.1f} s"


class Column(NamedTuple):
    key: str
    header: str
    value: Callable[[PeerStatistics], float | str]  # the number (or text) behind the cell
    format: Callable[[Any], str]  # takes what this column's value returns
    width: int  # characters in the text table


def _text(value) -> str:
    return str(value)


#: The per-peer table's columns in display order (the demo's, the monitor's, the static forms').
COLUMNS: tuple[Column, ...] = (
    Column("state", "state", lambda r: r.state, _text, 12),
    Column("queue_in", "queue in", lambda r: r.queue_in, format_count, 8),
    Column("queue_out", "queue out", lambda r: r.queue_out, format_count, 9),
    Column("msg_in", "in msg/s", lambda r: r.messages_in_per_s, format_count, 9),
    Column("mb_in", "in MiB/s", lambda r: r.bytes_in_per_s / MiB, format_rate, 8),
    Column("msg_out", "out msg/s", lambda r: r.messages_out_per_s, format_count, 9),
    Column("mb_out", "out MiB/s", lambda r: r.bytes_out_per_s / MiB, format_rate, 9),
    Column("memory", "memory", lambda r: r.memory, format_bytes, 10),
    Column("credit_in", "credit in", lambda r: r.credit_in, format_bytes, 10),
    Column("credit_out", "credit out", lambda r: r.credit_out, format_bytes, 10),
)
NAME_WIDTH = 10


def peer_name(peer: uuid.UUID, names: Mapping[uuid.UUID, str] | None = None) -> str:
    """The peer's display name: ``names[peer]`` if given, else the first 8 hex digits."""
    if names is not None:
        name = names.get(peer)
        if name is not None:
            return name
    return str(peer)[:8]


def with_names(text: str, names: Mapping[uuid.UUID, str] | None = None) -> str:
    """``text`` (a stall or wait sentence from ``statistics()``) with every peer id that has a
    display name in ``names`` written as that name: what people see says ``client-3``, not a
    UUID. Ids without a name are left whole (the sentence stays exact)."""
    if not names or not text:
        return text
    for peer, name in names.items():
        text = text.replace(str(peer), name)
    return text


def peer_values(row: PeerStatistics) -> dict[str, float | str]:
    """The numbers behind one table row, keyed like :data:`COLUMNS` (rates in msg/s and MiB/s,
    queue depths in messages, memory and credit in bytes)."""
    return {column.key: column.value(row) for column in COLUMNS}


def peer_fields(row: PeerStatistics,
                names: Mapping[uuid.UUID, str] | None = None) -> dict[str, str]:
    """One table row as strings: ``peer`` (the name) then every column of :data:`COLUMNS`."""
    fields = {"peer": peer_name(row.peer, names)}
    for column in COLUMNS:
        fields[column.key] = column.format(column.value(row))
    return fields


def _ordered(stats: CommunicatorStatistics, names) -> list[PeerStatistics]:
    return sorted(stats.peers, key=lambda r: (peer_name(r.peer, names), str(r.peer)))


def header_line(stats: CommunicatorStatistics) -> str:
    """The communicator's one-line header (role, transport, address, state, totals)."""
    return (f"netq {stats.purpose} {stats.protocol} on {format_address(stats.address)}  "
            f"{stats.state}  up {format_duration(stats.uptime)}  peers {len(stats.peers)}  "
            f"in {format_count(stats.messages_in_per_s)} msg/s "
            f"{format_byte_rate(stats.bytes_in_per_s)}  "
            f"out {format_count(stats.messages_out_per_s)} msg/s "
            f"{format_byte_rate(stats.bytes_out_per_s)}  "
            f"memory {format_bytes(stats.memory)}"
            + (f"  {shm_fact(stats)}" if stats.shm_bytes_in or stats.shm_bytes_out else "")
            + (f"  CANNOT CONNECT: {stats.connect_error}" if stats.connect_error else "")
            + (f"  {stats.get_waiting}" if stats.get_waiting else ""))


def shm_fact(stats: CommunicatorStatistics) -> str:
    """What went through shared memory (Protocol.UNIX): bytes each way, segments pooled."""
    return (f"shared memory in {format_bytes(stats.shm_bytes_in)}, "
            f"out {format_bytes(stats.shm_bytes_out)}, {stats.shm_segments} segments "
            f"({stats.shm_held} held by peers)")


def waiting_lines(stats: CommunicatorStatistics,
                  names: Mapping[uuid.UUID, str] | None = None) -> list[str]:
    """One line per peer whose traffic waits: its name, for how long, and why."""
    return [f"{peer_name(row.peer, names)} waits {row.blocked_for:.0f} s: "
            f"{with_names(row.blocked, names)}"
            for row in _ordered(stats, names) if row.blocked]


def _total_fields(stats: CommunicatorStatistics) -> dict[str, str]:
    return {"peer": "total", "state": "",
            "queue_in": format_count(sum(r.queue_in for r in stats.peers)),
            "queue_out": format_count(sum(r.queue_out for r in stats.peers)),
            "msg_in": format_count(stats.messages_in_per_s),
            "mb_in": format_rate(stats.bytes_in_per_s / MiB),
            "msg_out": format_count(stats.messages_out_per_s),
            "mb_out": format_rate(stats.bytes_out_per_s / MiB),
            "memory": format_bytes(stats.memory), "credit_in": "", "credit_out": ""}


def text_table(stats: CommunicatorStatistics,
               names: Mapping[uuid.UUID, str] | None = None, max_rows: int | None = None) -> str:
    """The header line and the per-peer table as fixed-width text (terminals, ``repr``)."""
    def line(fields: dict[str, str]) -> str:
        cells = [f"{fields['peer'][:NAME_WIDTH]:<{NAME_WIDTH}}"]
        for column in COLUMNS:
            text = fields[column.key]
            cells.append(f"{text:<{column.width}}" if column.key == "state"
                         else f"{text:>{column.width}}")
        return " ".join(cells).rstrip()

    rows = _ordered(stats, names)
    lines = [header_line(stats),
             line({"peer": "peer", **{c.key: c.header for c in COLUMNS}})]
    shown = rows if max_rows is None else rows[:max_rows]
    lines.extend(line(peer_fields(row, names)) for row in shown)
    if len(shown) < len(rows):
        lines.append(f"... and {len(rows) - len(shown)} more peers")
    lines.append(line(_total_fields(stats)))
    lines.extend(f"! {text}" for text in waiting_lines(stats, names))
    return "\n".join(lines)


_KEYS = ("peer", *(c.key for c in COLUMNS))
_TEXT = frozenset({"peer", "state"})  # the cells that need escaping


def title_state(stats: CommunicatorStatistics, view_state: str | None = None) -> str:
    """The one word the title's badge shows: ``view_state`` (``"stopped"``) if given, else the
    communicator's state, refined for people (a client not yet connected is ``connecting``,
    one whose last connect failed ``cannot connect``, ``waiting`` while any peer's traffic
    waits or a ``get()`` has waited ``stall_warning`` seconds)."""
    if view_state is not None and stats.state == "open":
        return view_state
    if stats.state != "open":
        return stats.state
    if stats.connect_error:
        return "cannot connect"
    if stats.blocked or stats.get_waiting:
        return "waiting"
    if stats.purpose == "client" and not any(r.state == "connected" for r in stats.peers):
        return "connecting"
    return "open"


# ------------------------------------------------------------------ the monitor's view model
#
# What a monitor shows, computed once in Python and drawn twice: by the live widget's ES module
# (netq.widgets, widgets/frontend/monitor.js) from its synced traits, and by monitor_html() as the
# static form (no script). Both draw the same DOM (classes and data attributes below), so a
# static form and a live view read alike and the browser tests check both the same way.
# Every number people read is formatted here; the browser formats nothing.

# A peer's colour in the charts, the legend and the table's swatch: 20 distinct colours (the
# default plots at most 16 peers), the first ten as before (Category10), then their light tints.
PEER_COLOURS = (*PALETTE, "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
                "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")
NEGATIVE_CREDIT = ("credit may dip below zero by up to one message: a message may start on "
                   "any positive credit (netq.statistics)")
# The badge of a view that updates vs. one that does not: a static form is never one of LIVE.
LIVE_STATES = frozenset({"open", "connecting", "closing", "waiting", "cannot-connect"})
STATIC_STATES = frozenset({"snapshot", "stopped", "closed"})
#: One sample of a peer, in this order: what the charts plot (bytes/s, messages, bytes).
SAMPLE = ("bytes_in_per_s", "bytes_out_per_s", "queue_in", "queue_out", "memory")


class Chart(NamedTuple):
    metric: str  # svg.netq-chart[data-metric]
    title: str
    unit: str  # "byte_rate", "count" or "bytes": how its ticks read
    lines: tuple[tuple[int, str], ...]  # (index into SAMPLE, SVG dash or "") per peer


CHARTS = (
    Chart("throughput", "throughput (solid: in, dashed: out)", "byte_rate",
          ((0, ""), (1, "5 3"))),
    Chart("queue", "queued messages (solid: in, dashed: out)", "count", ((2, ""), (3, "5 3"))),
    Chart("memory", "memory held", "bytes", ((4, ""),)),
)


def busiest_first(peers, names: Mapping[uuid.UUID, str] | None = None) -> list[PeerStatistics]:
    """Peers ordered as the monitor lists and plots them: the most bytes per second (in + out)
    first, then the most messages per second, then by name."""
    return sorted(peers, key=lambda r: (-(r.bytes_in_per_s + r.bytes_out_per_s),
                                        -(r.messages_in_per_s + r.messages_out_per_s),
                                        peer_name(r.peer, names), str(r.peer)))


def peer_sample(row: PeerStatistics) -> list[float]:
    """One row's chart values in :data:`SAMPLE` order (bytes/s, messages, bytes)."""
    return [float(getattr(row, key)) for key in SAMPLE]


def badge_state(stats: CommunicatorStatistics, *, live: bool,
                view_state: str | None = None) -> str:
    """The badge's ``data-state``: while live, the communicator's state as :func:`title_state`
    refines it (``waiting`` when any peer's traffic or a ``get()`` waits); in a static form
    ``closed``, ``stopped`` (``view_state``) or ``snapshot``, never a live state."""
    if live:
        return title_state(stats).replace(" ", "-")
    if stats.state == "closed":
        return "closed"
    return "stopped" if view_state == "stopped" else "snapshot"


def snapshot_sentence(state: str, taken_at: float) -> str:
    """What a static form says about itself: a snapshot, and the wall-clock time it shows."""
    clock = time.strftime("%H:%M:%S", time.localtime(taken_at))
    why = {"stopped": "the view was stopped", "closed": "the communicator is closed"}.get(state)
    return f"snapshot taken {clock}, not live" + (f" ({why})" if why else "")


def _sum_fields(rows: list[PeerStatistics], label: str) -> dict[str, str]:
    return {"peer": label, "state": "",
            "queue_in": format_count(sum(r.queue_in for r in rows)),
            "queue_out": format_count(sum(r.queue_out for r in rows)),
            "msg_in": format_count(sum(r.messages_in_per_s for r in rows)),
            "mb_in": format_rate(sum(r.bytes_in_per_s for r in rows) / MiB),
            "msg_out": format_count(sum(r.messages_out_per_s for r in rows)),
            "mb_out": format_rate(sum(r.bytes_out_per_s for r in rows) / MiB),
            "memory": format_bytes(sum(r.memory for r in rows)), "credit_in": "",
            "credit_out": ""}


def monitor_view(stats: CommunicatorStatistics,
                 names: Mapping[uuid.UUID, str] | None = None, *,
                 max_rows: int | None = 50, live: bool = False, view_state: str | None = None,
                 colours: Mapping[uuid.UUID, str] | None = None,
                 taken_at: float | None = None,
                 ordered: list[PeerStatistics] | None = None) -> dict[str, Any]:
    """Everything a monitor shows but its charts, as JSON-ready data (text already formatted).

    ``title``: role, address, ``state`` (the badge's ``data-state``), ``label``, ``uptime``,
    ``facts`` and ``alerts``; ``columns``: ``[key, header, numeric]``; ``rows``: the busiest
    ``max_rows`` peers (:func:`busiest_first`), each with its display name (``peer``), id,
    chart colour (``""`` if not plotted), ``blocked`` (why it waits, peers named), ``cells``
    (texts in column order), ``sort`` (numbers or texts to sort by) and ``marks`` (column key
    -> a key of ``notes``); ``others``: the peers past ``max_rows`` folded into one row
    (``count``, ``cells``) or None; ``total``: cells over all peers; ``waiting``: one sentence
    per wait; ``notes``: footnotes the marks refer to; ``live``, ``taken`` (the wall-clock
    time of the snapshot, ``HH:MM:SS``) and ``snapshot`` (the static form's sentence, ``""``
    while live). ``taken_at``: wall-clock time of the snapshot
    (default: now); ``ordered``: ``stats.peers`` already sorted by :func:`busiest_first`.
    """
    state = badge_state(stats, live=live, view_state=view_state)
    taken = time.time() if taken_at is None else taken_at
    if ordered is None:
        ordered = busiest_first(stats.peers, names)
    shown = ordered if max_rows is None else ordered[:max_rows]
    folded = ordered[len(shown):]
    notes: dict[str, str] = {}

    def peer_row(row: PeerStatistics) -> dict[str, Any]:
        fields = peer_fields(row, names)
        marks = {key: "negative-credit" for key in ("credit_in", "credit_out")
                 if getattr(row, key) < 0}
        if marks:
            notes["negative-credit"] = NEGATIVE_CREDIT
        values = peer_values(row)
        return {"peer": fields["peer"], "id": str(row.peer),
                "colour": (colours or {}).get(row.peer, ""),
                "blocked": with_names(row.blocked, names),
                "cells": [fields[key] for key in _KEYS],
                "sort": [fields["peer"], *(values[key] for key in _KEYS[1:])],
                "marks": marks}

    rows = [peer_row(row) for row in shown]
    others = None
    if folded:
        fields = _sum_fields(folded, f"others ({len(folded)} peers)")
        others = {"count": len(folded), "cells": [fields[key] for key in _KEYS]}
    total = _sum_fields(list(stats.peers), "total")
    total.update({"msg_in": format_count(stats.messages_in_per_s),
                  "mb_in": format_rate(stats.bytes_in_per_s / MiB),
                  "msg_out": format_count(stats.messages_out_per_s),
                  "mb_out": format_rate(stats.bytes_out_per_s / MiB),
                  "memory": format_bytes(stats.memory)})
    budget = (f" of {format_bytes(stats.recv_budget + stats.send_budget)} budget"
              if stats.recv_budget or stats.send_budget else "")
    count = len(stats.peers)
    waiting = waiting_lines(stats, names)
    if stats.get_waiting:
        waiting.append(with_names(stats.get_waiting, names))
    return {
        "title": {
            "role": f"netq {stats.protocol.upper()} {stats.purpose}",
            "address": format_address(stats.address),
            "state": state, "label": state.replace("-", " "),
            "uptime": f"up {format_uptime(stats.uptime)}",
            "facts": [f"{count} peer{'' if count == 1 else 's'}",
                      f"in {format_count(stats.messages_in_per_s)} msg/s, "
                      f"{format_byte_rate(stats.bytes_in_per_s)}",
                      f"out {format_count(stats.messages_out_per_s)} msg/s, "
                      f"{format_byte_rate(stats.bytes_out_per_s)}",
                      f"memory {format_bytes(stats.memory)}{budget}",
                      *([shm_fact(stats)] if stats.shm_bytes_in or stats.shm_bytes_out
                        else [])],
            "alerts": ([f"cannot connect: {with_names(stats.connect_error, names)}"]
                       if stats.connect_error else []),
        },
        "columns": [["peer", "peer", False],
                    *([c.key, c.header, c.key != "state"] for c in COLUMNS)],
        "rows": rows, "others": others, "total": [total[key] for key in _KEYS],
        "waiting": waiting, "notes": notes, "live": live,
        "taken": time.strftime("%H:%M:%S", time.localtime(taken)),
        "snapshot": "" if live else snapshot_sentence(state, taken),
    }


# ------------------------------------------------------------------ chart axes


def format_tick_bytes(value: float) -> str:
    """A byte tick with no needless decimals: ``0``, ``512 B``, ``256 KiB``, ``1.5 MiB``."""
    if value == 0:
        return "0"
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if abs(value) >= scale or suffix == "B":
            return f"{value / scale:.3g} {suffix}"
    raise AssertionError("unreachable")


def axis_ticks(highest: float, unit: str, *, intervals: int = 4) -> tuple[float, list]:
    """The y axis for values up to ``highest``: ``(top, [[value, label], ...])``, from 0 to
    ``top`` (the first tick at or above ``highest``, so no line leaves the chart) in at most
    ``intervals`` equal steps. ``unit``: ``"count"`` (integer steps: 1, 2, 5 x 10^n),
    ``"bytes"`` or ``"byte_rate"`` (binary steps: 1, 2, 4 ... 512 x 1024^n, labelled in B, KiB,
    MiB, GiB; ``/s`` for a rate)."""
    if unit == "count":
        steps = [m * 10 ** e for e in range(0, 13) for m in (1, 2, 5)]
    else:
        steps = [float(2 ** e) for e in range(0, 50)]
    target = max(highest, 0.0)
    step = next((s for s in steps if s * intervals >= target), steps[-1])
    count = max(1, math.ceil(target / step)) if target > 0 else 1
    top = step * count
    if unit == "count":
        label: Callable[[float], str] = lambda v: format_count(v)  # noqa: E731
    elif unit == "byte_rate":
        label = lambda v: f"{format_tick_bytes(v)}/s" if v else "0"  # noqa: E731
    else:
        label = format_tick_bytes
    return float(top), [[float(step * k), label(step * k)] for k in range(count + 1)]


def _uptime_tick(seconds: float) -> str:
    if seconds < 60 and abs(seconds - round(seconds)) > 1e-6:
        return f"{seconds:.1f} s"  # the sub-second steps of a young view's axis
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes == 0:
        return f"{secs} s"
    return f"{minutes} min" if secs == 0 else f"{minutes}:{secs:02d}"


def time_axis(start: float, end: float, *, intervals: int = 6) -> list:
    """Uptime ticks between ``start`` and ``end`` (seconds): ``[[t, label]]`` at the smallest
    round step that gives at most ``intervals`` steps, so a view a few seconds old gets several
    ticks (half seconds), not one or two."""
    span = max(end - start, 1e-9)
    steps = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
             14400)
    step = next((s for s in steps if span / s <= intervals), steps[-1])
    ticks = []
    index = math.ceil(start / step - 1e-9)
    while index * step <= end + 1e-9:
        value = round(index * step, 6)  # no 0.30000000000000004 from repeated sums
        ticks.append([float(value), _uptime_tick(value)])
        index += 1
    return ticks


def chart_frame(times: list[float], plotted: list[dict[str, Any]],
                highest: Mapping[str, float], history: int) -> dict[str, Any]:
    """What the charts need besides the points: the time axis, each chart's title, top and
    ticks (:func:`axis_ticks` of ``highest[metric]``) and line styles, and the plotted peers
    (``key``, ``peer``, ``label``, ``colour``, ``width``) in legend order."""
    start, end = (times[0], times[-1]) if times else (0.0, 1.0)
    if end <= start:
        end = start + 1.0
    charts = []
    for chart in CHARTS:
        top, ticks = axis_ticks(highest.get(chart.metric, 0.0), chart.unit)
        charts.append({"metric": chart.metric, "title": chart.title, "top": top,
                       "ticks": ticks, "lines": [list(line) for line in chart.lines]})
    return {"history": history, "x": {"start": start, "end": end,
                                      "ticks": time_axis(start, end)},
            "charts": charts, "plotted": plotted}


# ------------------------------------------------------------------ the static form

# The chart geometry, in pixels (monitor.js draws the live charts with the same numbers): the
# left margin holds the widest tick label (``512 KiB/s``), the top margin half a label's
# height so that the top tick's label is never clipped.
CHART_HEIGHT, CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM = 150, 66, 10, 10, 20
STATIC_CHART_WIDTH = 310


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


def chart_svg(chart: Mapping[str, Any], frame: Mapping[str, Any], times: list[float],
              series: Mapping[str, list], width: int = STATIC_CHART_WIDTH) -> str:
    """One chart of :func:`chart_frame` as inline SVG: ``svg.netq-chart[data-metric]`` with one
    ``path.netq-series[data-peer]`` per plotted peer and line (gaps where a sample is None)."""
    escape = html.escape
    height = CHART_HEIGHT
    inner_w = width - CHART_LEFT - CHART_RIGHT
    inner_h = height - CHART_TOP - CHART_BOTTOM
    start, end = frame["x"]["start"], frame["x"]["end"]
    top = chart["top"] or 1.0

    def x(t: float) -> float:
        return CHART_LEFT + (t - start) / (end - start) * inner_w

    def y(v: float) -> float:
        return CHART_TOP + inner_h - min(max(v / top, 0.0), 1.0) * inner_h

    out = [f'<svg class="netq-chart" data-metric="{escape(chart["metric"])}" '
           f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">']
    for value, label in chart["ticks"]:
        out.append(f'<line class="netq-grid" x1="{CHART_LEFT}" x2="{width - CHART_RIGHT}" '
                   f'y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
                   f'<text class="netq-tick" x="{CHART_LEFT - 5}" y="{y(value) + 3.5:.1f}" '
                   f'text-anchor="end">{escape(label)}</text>')
    for value, label in frame["x"]["ticks"]:
        out.append(f'<text class="netq-tick" x="{x(value):.1f}" y="{height - 5}" '
                   f'text-anchor="middle">{escape(label)}</text>')
    for entry in frame["plotted"]:
        samples = series.get(entry["key"], [])
        for index, dash in chart["lines"]:
            path = []
            pen = "M"
            for t, sample in zip(times, samples, strict=False):
                if sample is None or sample[index] is None:
                    pen = "M"
                    continue
                path.append(f"{pen}{x(t):.1f},{y(sample[index]):.1f}")
                pen = "L"
            if not path:
                continue
            dashed = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<path class="netq-series" data-peer="{escape(entry["peer"])}" '
                       f'data-line="{index}" fill="none" stroke="{entry["colour"]}" '
                       f'stroke-width="{entry["width"]}"{dashed} d="{" ".join(path)}">'
                       f'<title>{escape(entry["label"])}</title></path>')
    out.append(f'<rect class="netq-frame" x="{CHART_LEFT}" y="{CHART_TOP}" width="{inner_w}" '
               f'height="{inner_h}" fill="none"/></svg>')
    return "".join(out)


def monitor_html(view: Mapping[str, Any], frame: Mapping[str, Any] | None = None,
                 times: list[float] | None = None, series: Mapping[str, list] | None = None,
                 *, style: bool = True) -> str:
    """The static form of a monitor (:func:`monitor_view`, plus the charts of ``frame`` over
    ``times`` and ``series`` when given): the live view's DOM without script, ``data-live="0"``
    with its ``.netq-snapshot`` sentence. Every text is escaped."""
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


# ---------------------------------------------------------------------------- Jupyter hooks


def in_kernel() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), where widgets can live.

    False in plain Python and the IPython terminal. (nbval and nbconvert run a kernel too:
    there the display carries the static text/HTML next to the widget.)
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - a half-initialized IPython is "no kernel"
        return False
    return getattr(shell, "kernel", None) is not None


class StaticSummary:
    """A communicator's summary as text and HTML, fresh at each display; no thread.

    What ``Communicator.monitor()`` returns when the widget dependencies are not installed.
    """

    def __init__(self, communicator, names: Mapping[uuid.UUID, str] | None = None,
                 max_rows: int | None = 50, reason: str = "") -> None:
        self.communicator = communicator
        self.names = names
        self.max_rows = max_rows
        self.reason = reason  # why this is not a live widget

    def __repr__(self) -> str:
        return text_table(self.communicator.statistics(), self.names, self.max_rows)

    def _repr_html_(self) -> str:
        return static_bundle(self.communicator.statistics(), self.names,
                             self.max_rows)["text/html"]

    def start(self) -> StaticSummary:  # the Monitor interface, doing nothing
        return self

    def stop(self) -> None:
        pass


def widgets_missing() -> str | None:
    """Why ``netq.widgets`` cannot be imported (None when it can)."""
    try:
        import netq.widgets  # noqa: F401
    except ImportError as error:
        return (f"live widgets need the netq[widgets] extra "
                f"(pip install 'netq[widgets]'): {error}")
    return None


def monitor(communicator, **options):
    """``Communicator.monitor()``: a live ``netq.widgets.Monitor``, or a StaticSummary."""
    reason = widgets_missing()
    if reason is not None:
        warnings.warn(reason, stacklevel=3)
        return StaticSummary(communicator, options.get("names"), reason=reason)
    from netq.widgets import Monitor

    return Monitor(communicator, **options)


def communicator_bundle(communicator, include=None, exclude=None) -> dict | tuple[dict, dict]:
    """``Communicator._repr_mimebundle_``: live in a kernel with the widgets (with metadata
    where the frontend needs some), else static."""
    if in_kernel() and widgets_missing() is None:
        from netq.widgets import Monitor

        return Monitor(communicator)._repr_mimebundle_(include, exclude)
    return static_bundle(communicator.statistics())


def communicator_display(communicator) -> None:
    """``Communicator._ipython_display_``: a live monitor displayed with a display id (its
    static form replaces it when it stops), or the static summary."""
    from IPython.display import display

    if in_kernel() and widgets_missing() is None:
        from netq.widgets import Monitor

        Monitor(communicator)._ipython_display_()
        return
    display(static_bundle(communicator.statistics()), raw=True)


def communicator_marimo(communicator):
    """``Communicator._display_`` (marimo asks it first): a live monitor, started, whose
    anywidget marimo renders; without the widgets, the static summary."""
    if widgets_missing() is None:
        from netq.widgets import Monitor

        return Monitor(communicator)._display_()
    return StaticSummary(communicator)


def environment() -> dict[str, str]:
    """Where a measurement was taken: netq and Python versions, CPU model, cores usable by this
    process, and the load average (1 min) against them. Notebooks print it first, so that a
    machine-dependent number is read beside the machine that produced it."""
    import os
    import platform

    from . import __version__

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        load = f"{os.getloadavg()[0]:.2f}"
    except OSError:
        load = "unknown"
    return {"netq": __version__, "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}", "cpu": model,
            "cores": str(cores), "load (1 min)": load}


def environment_line() -> str:
    """:func:`environment` as one line, e.g. for a notebook's first output."""
    env = environment()
    return (f"netq {env['netq']}, Python {env['python']} on {env['system']}; "
            f"{env['cores']} cores ({env['cpu']}); load average {env['load (1 min)']} "
            f"over 1 min")
