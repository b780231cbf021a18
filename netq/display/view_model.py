"""The monitor's view model: everything a monitor shows but its charts, computed once in Python
and drawn twice.

The live widget's ES module (netq.widgets, ``widgets/frontend/monitor.js``) draws it from its
synced traits, and :func:`netq.display.static_form.monitor_html` as the static form (no
script). Both draw the same DOM (classes and data attributes), so a static form and a live view
read alike and the browser tests check both the same way. Every number people read is
formatted here; the browser formats nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from ..statistics import CommunicatorStatistics, PeerStatistics
from .formatting import (
    MiB,
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_rate,
    format_uptime,
)
from .tables import (
    COLUMNS,
    peer_fields,
    peer_name,
    peer_values,
    shm_fact,
    title_state,
    waiting_lines,
    with_names,
)

__all__ = ("NEGATIVE_CREDIT", "LIVE_STATES", "STATIC_STATES", "memory_budget", "busiest_first",
           "badge_state", "static_badge", "snapshot_sentence", "clock", "FinalPicture",
           "monitor_view")

NEGATIVE_CREDIT = ("credit may dip below zero by up to one message: a message may start on "
                   "any positive credit (netq.statistics)")
# The badge of a view that updates vs. one that does not: a static form is never one of LIVE.
LIVE_STATES = frozenset({"open", "connecting", "closing", "waiting", "cannot-connect"})
STATIC_STATES = frozenset({"snapshot", "stopped", "closed"})
# The cells of a row in order: the peer's name, then every column.
_KEYS = ("peer", *(c.key for c in COLUMNS))


def memory_budget(stats: CommunicatorStatistics) -> int:
    """The memory a communicator may hold by its budgets, in bytes: its receive budget (shared
    by its peers) and a send budget per peer (a client has one peer, the server)."""
    return stats.recv_budget + stats.send_budget * max(1, len(stats.peers))


def busiest_first(peers, names: Mapping[uuid.UUID, str] | None = None) -> list[PeerStatistics]:
    """Peers ordered as the monitor lists and plots them: the most bytes per second (in + out)
    first, then the most messages per second, then by name."""
    return sorted(peers, key=lambda r: (-(r.bytes_in_per_s + r.bytes_out_per_s),
                                        -(r.messages_in_per_s + r.messages_out_per_s),
                                        peer_name(r.peer, names), str(r.peer)))


def badge_state(stats: CommunicatorStatistics, *, live: bool,
                view_state: str | None = None) -> str:
    """The badge's ``data-state``: while live, the communicator's state as
    :func:`~netq.display.tables.title_state` refines it (``waiting`` when any peer's traffic
    or a ``get()`` waits); in a static form ``view_state`` if it is one of
    ``STATIC_STATES`` (a view frozen before its communicator closed says ``closed``),
    else ``closed`` or ``snapshot``: never a live state."""
    if live:
        return title_state(stats).replace(" ", "-")
    return static_badge(stats.state == "closed", view_state)


def static_badge(closed: bool, view_state: str | None = None) -> str:
    """The badge of a static form (the monitor's and the dashboard's): ``view_state`` if it
    is one of ``STATIC_STATES`` (what a frozen or stopped view keeps saying), else
    ``closed`` when what it shows is closed, else ``snapshot``."""
    if view_state in STATIC_STATES:
        return view_state
    return "closed" if closed else "snapshot"


def clock(when: float) -> str:
    """A wall-clock time (``time.time()``) as the views print it: ``HH:MM:SS``, local time."""
    return time.strftime("%H:%M:%S", time.localtime(when))


def snapshot_sentence(state: str, taken_at: float, reason: str | None = None) -> str:
    """What a static form says about itself: a snapshot, the wall-clock time of the sample
    every figure in it comes from, and why it is not live (``reason``, or what ``state``
    implies: ``stopped``, ``closed``)."""
    why = reason or {"stopped": "the view was stopped",
                     "closed": "the communicator is closed"}.get(state)
    return f"snapshot taken {clock(taken_at)}, not live" + (f" ({why})" if why else "")


_PictureT = TypeVar("_PictureT")


class FinalPicture(Generic[_PictureT]):
    """The picture a view keeps when what it shows closes: the last sample taken before the
    closing began, not the empty one after it.

    Feed it every sample taken while the thing shown is open, with its ``size`` (a monitor:
    its peers still connected; the dashboard: its communicators still open). Closing is
    seen as a decline: samples whose size falls, one after the other, with at most one
    sample between two falls that holds it (one client's ``close()`` may outlast a sampling
    interval). :meth:`final` is the sample just before the current decline began (the full
    picture: the 32 peers, their rates and waits) or, if none is under way, the newest one.
    A size that grows, or holds for two samples in a row, ends a decline: a peer that left
    long ago does not pin the picture to its time. Holds two samples, whatever they are.
    """

    __slots__ = ("_newest", "_newest_size", "_before_decline", "_held")

    def __init__(self) -> None:
        self._newest: _PictureT | None = None
        self._newest_size = 0
        self._before_decline: _PictureT | None = None
        self._held = False  # the size held once since the decline's last fall

    def add(self, picture: _PictureT, size: int) -> None:
        if self._newest is not None and size < self._newest_size:
            if self._before_decline is None:
                self._before_decline = self._newest
            self._held = False
        elif size == self._newest_size and self._before_decline is not None and not self._held:
            self._held = True
        else:
            self._before_decline, self._held = None, False
        self._newest, self._newest_size = picture, size

    def final(self) -> _PictureT | None:
        """The picture to keep (None before the first sample)."""
        return self._before_decline if self._before_decline is not None else self._newest


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
                 ordered: list[PeerStatistics] | None = None,
                 snapshot_reason: str | None = None) -> dict[str, Any]:
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
    (default: now); ``ordered``: ``stats.peers`` already sorted by :func:`busiest_first`;
    ``view_state``: the static form's badge (:func:`badge_state`); ``snapshot_reason``: why
    it is not live, in its sentence (:func:`snapshot_sentence`). A closed communicator's
    rates are those of its last seconds, not current: its title states none.
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
    budget = (f" of {format_bytes(memory_budget(stats))} budget"
              if stats.recv_budget or stats.send_budget else "")
    count = len(stats.peers)
    waiting = waiting_lines(stats, names)
    if stats.get_waiting:
        waiting.append(with_names(stats.get_waiting, names))
    rates = [] if stats.state == "closed" else [
        f"in {format_count(stats.messages_in_per_s)} msg/s, "
        f"{format_byte_rate(stats.bytes_in_per_s)}",
        f"out {format_count(stats.messages_out_per_s)} msg/s, "
        f"{format_byte_rate(stats.bytes_out_per_s)}"]
    return {
        "title": {
            "role": f"netq {stats.protocol.upper()} {stats.purpose}",
            "address": format_address(stats.address),
            "state": state, "label": state.replace("-", " "),
            "uptime": f"up {format_uptime(stats.uptime)}",
            "facts": [f"{count} peer{'' if count == 1 else 's'}",
                      *rates,
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
        "taken": clock(taken),
        "snapshot": "" if live else snapshot_sentence(state, taken, snapshot_reason),
    }
