"""The per-peer table: its columns, one peer's row as numbers or text, the whole snapshot as
fixed-width text (the terminal demo, ``repr``), and the header line above it.

:data:`COLUMNS` is the single list of what a peer's row shows: the text table, the monitor's
view model (:mod:`netq.display.view_model`) and the dashboard all read it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..statistics import CommunicatorStatistics, PeerStatistics
from .formatting import (
    MiB,
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_duration,
    format_rate,
)

__all__ = ("Column", "COLUMNS", "NAME_WIDTH", "peer_name", "with_names", "peer_values",
           "peer_fields", "header_line", "shm_fact", "waiting_lines", "text_table",
           "title_state")


class Column(NamedTuple):
    key: str
    header: str
    value: Callable[[PeerStatistics], float | str]  # the number (or text) behind the cell
    format: Callable[[Any], str]  # takes what this column's value returns
    width: int  # characters in the text table


def _text(value) -> str:
    return str(value)


#: The per-peer table's columns in display order (the demo's, the monitor's, the static forms').
#: Rates in msg/s and MiB/s, queue depths in messages, memory and credit in bytes.
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
NAME_WIDTH = 10  # characters of a peer's name in the text table


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
