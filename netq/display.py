"""Display fields of a statistics snapshot: the one place that turns a ``PeerStatistics`` into
what people read, shared by the terminal demo (``python -m netq demo``), the static text/HTML
summary and the live Jupyter widget (``netq.widgets``).

Standard library only: the core package and the demo need none of the widget dependencies.

* :data:`COLUMNS` lists the per-peer columns in display order (key, header, unit).
* :func:`peer_values` gives the numbers behind them (what the widget plots),
  :func:`peer_fields` the same row as formatted strings (what the tables show).
* :func:`text_table` / :func:`html_table` render a whole :class:`CommunicatorStatistics`.
"""

from __future__ import annotations

import html
import sys
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .statistics import CommunicatorStatistics, PeerStatistics

__all__ = ("Column", "COLUMNS", "peer_name", "peer_values", "peer_fields", "format_count",
           "format_rate", "format_bytes", "text_table", "html_table", "header_line",
           "static_bundle", "in_kernel", "StaticSummary", "monitor", "communicator_bundle")

MB = 1e6  # rates in MB/s (decimal, like network rates)
MiB = float(1 << 20)  # memory and credit in MiB (binary, like buffers)


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
    """MB/s (already divided by :data:`MB`) with two significant decimals near zero."""
    value = float(value)
    if value != value:
        return "-"
    if value == 0:
        return "0"
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def format_bytes(value: float) -> str:
    """Bytes as B / KiB / MiB / GiB: ``0 B``, ``64.0 KiB``, ``4.00 MiB``."""
    value = float(value)
    if value != value:
        return "-"
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            number = value / scale
            return f"{number:.2f} {suffix}" if abs(number) < 10 else f"{number:.1f} {suffix}"
    return f"{value:.0f} B"


class Column(NamedTuple):
    key: str
    header: str
    value: Callable[[PeerStatistics], float | str]  # the number (or text) behind the cell
    format: Callable[[Any], str]  # takes what this column's value returns
    width: int  # characters in the text table


def _text(value) -> str:
    return str(value)


COLUMNS: tuple[Column, ...] = (
    Column("state", "state", lambda r: r.state, _text, 12),
    Column("queue_in", "queue in", lambda r: r.queue_in, format_count, 8),
    Column("queue_out", "queue out", lambda r: r.queue_out, format_count, 9),
    Column("msg_in", "in msg/s", lambda r: r.messages_in_per_s, format_count, 9),
    Column("mb_in", "in MB/s", lambda r: r.bytes_in_per_s / MB, format_rate, 8),
    Column("msg_out", "out msg/s", lambda r: r.messages_out_per_s, format_count, 9),
    Column("mb_out", "out MB/s", lambda r: r.bytes_out_per_s / MB, format_rate, 8),
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


def peer_values(row: PeerStatistics) -> dict[str, float | str]:
    """The numbers behind one table row, keyed like :data:`COLUMNS` (rates in msg/s and MB/s,
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
    return (f"netq {stats.purpose} {stats.protocol} on {stats.address}  {stats.state}  "
            f"up {stats.uptime:.1f} s  peers {len(stats.peers)}  "
            f"in {format_count(stats.messages_in_per_s)} msg/s "
            f"{format_rate(stats.bytes_in_per_s / MB)} MB/s  "
            f"out {format_count(stats.messages_out_per_s)} msg/s "
            f"{format_rate(stats.bytes_out_per_s / MB)} MB/s  "
            f"memory {format_bytes(stats.memory)}"
            + (f"  CANNOT CONNECT: {stats.connect_error}" if stats.connect_error else ""))


def waiting_lines(stats: CommunicatorStatistics,
                  names: Mapping[uuid.UUID, str] | None = None) -> list[str]:
    """One line per peer whose traffic waits: its name, for how long, and why."""
    return [f"{peer_name(row.peer, names)} waits {row.blocked_for:.0f} s: {row.blocked}"
            for row in _ordered(stats, names) if row.blocked]


def _total_fields(stats: CommunicatorStatistics) -> dict[str, str]:
    return {"peer": "total", "state": "",
            "queue_in": format_count(sum(r.queue_in for r in stats.peers)),
            "queue_out": format_count(sum(r.queue_out for r in stats.peers)),
            "msg_in": format_count(stats.messages_in_per_s),
            "mb_in": format_rate(stats.bytes_in_per_s / MB),
            "msg_out": format_count(stats.messages_out_per_s),
            "mb_out": format_rate(stats.bytes_out_per_s / MB),
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
_STYLE = ("<style>.netq-table{border-collapse:collapse;font-family:monospace;font-size:12px}"
          ".netq-table th,.netq-table td{padding:1px 8px;text-align:right;"
          "border-bottom:1px solid #ddd}"
          ".netq-table th:first-child,.netq-table td:first-child,"
          ".netq-table td.state,.netq-table th.state{text-align:left}"
          ".netq-table tr.total td{font-weight:bold;border-top:1px solid #888}"
          ".netq-table tr.blocked td{background:#fde2e1}"
          ".netq-waits{font-family:monospace;font-size:12px;color:#a00;margin:2px 0}"
          ".netq-header{font-family:monospace;font-size:12px;margin:2px 0}</style>")


def html_table(stats: CommunicatorStatistics,
               names: Mapping[uuid.UUID, str] | None = None, max_rows: int | None = None,
               *, header: bool = True) -> str:
    """The same table as HTML (escaped): one ``<tr data-peer=...>`` per peer, a total row."""
    escape = html.escape
    parts = [_STYLE, '<div class="netq-summary">']
    if header:
        parts.append(f'<div class="netq-header">{escape(header_line(stats))}</div>')
    parts.append('<table class="netq-table"><thead><tr><th>peer</th>')
    parts.extend(f'<th class="{c.key}">{escape(c.header)}</th>' for c in COLUMNS)
    parts.append("</tr></thead><tbody>")
    rows = _ordered(stats, names)
    shown = rows if max_rows is None else rows[:max_rows]

    def cells(fields: dict[str, str]) -> str:
        # numbers are formatted by us; only names and states come from elsewhere
        return "".join(
            f'<td class="{key}">{escape(fields[key]) if key in _TEXT else fields[key]}</td>'
            for key in _KEYS)

    for row in shown:
        # A peer whose traffic waits stands out, and says why on hover (and below the table).
        kind, why = ("peer blocked", f' title="{escape(row.blocked)}"') if row.blocked \
            else ("peer", "")
        parts.append(f'<tr class="{kind}" data-peer="{row.peer}"{why}>'
                     f'{cells(peer_fields(row, names))}</tr>')
    if len(shown) < len(rows):
        parts.append(f'<tr class="more"><td colspan="{len(COLUMNS) + 1}">... and '
                     f'{len(rows) - len(shown)} more peers</td></tr>')
    parts.append(f'<tr class="total">{cells(_total_fields(stats))}</tr>')
    parts.append("</tbody></table>")
    parts.extend(f'<div class="netq-waits">{escape(text)}</div>'
                 for text in waiting_lines(stats, names))
    parts.append("</div>")
    return "".join(parts)


def static_bundle(stats: CommunicatorStatistics,
                  names: Mapping[uuid.UUID, str] | None = None,
                  max_rows: int | None = 50) -> dict[str, str]:
    """``text/plain`` + ``text/html`` for a display without a live frontend."""
    return {"text/plain": text_table(stats, names, max_rows),
            "text/html": html_table(stats, names, max_rows)}


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
        return html_table(self.communicator.statistics(), self.names, self.max_rows)

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


def communicator_bundle(communicator, include=None, exclude=None) -> dict:
    """``Communicator._repr_mimebundle_``: live in a kernel with the widgets, else static."""
    if in_kernel() and widgets_missing() is None:
        from netq.widgets import Monitor

        return Monitor(communicator)._repr_mimebundle_(include, exclude)
    return static_bundle(communicator.statistics())
