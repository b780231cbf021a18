"""The dashboard's view model: what its views show, computed from the samples, apart from
the widget, its thread and its display (:mod:`netq.widgets.dashboard`).

:class:`DashboardModel` keeps the log of waits (when each began and ended), the bounded
history of every link and communicator its sparklines are drawn from, and the display names;
:meth:`DashboardModel.view` turns a sample into the JSON document the live view
(``frontend/dashboard.js``) and the static forms (:mod:`netq.widgets.dashboard_html`) draw:
every figure formatted, the rows to show, the map's geometry (:func:`map_layout`), the waits.
"""

from __future__ import annotations

import collections
import re
import uuid
from collections.abc import Mapping
from typing import Any

from ..display.formatting import (
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_duration,
)
from ..display.tables import peer_name, with_names
from ..display.view_model import clock, memory_budget, snapshot_sentence, static_badge
from ..statistics import CommunicatorStatistics
from .dashboard_model import (
    HISTORY,
    DashboardSnapshot,
    History,
    LinkFigures,
    Stall,
    communicator_state,
    find_links,
    map_layout,
)

__all__ = ("DashboardModel", "MAX_LINKS", "MAX_COMMUNICATORS", "MAX_STALLS", "NEGATIVE_CREDIT")

MAX_LINKS = 12  # link rows shown; the others are summed in one aggregate row
MAX_COMMUNICATORS = 10  # communicator rows shown; likewise
MAX_STALLS = 8  # ongoing waits listed one by one; the rest are counted
NEGATIVE_CREDIT = ("credit may dip below zero by up to one message: a message may start on any "
                   "positive credit, and its whole size is taken from it")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class DashboardModel:
    """The dashboard's state between samples and the view document of one sample.

    ``names``: display names by communicator id (or peer id); ``interval``: seconds between
    samples (the live view's staleness); ``history``: samples kept per link and communicator;
    ``stall_log``: ended waits listed; ``max_links`` / ``max_communicators``: rows shown.
    """

    def __init__(self, names: Mapping[uuid.UUID, str], interval: float, *,
                 history: int = HISTORY, stall_log: int = 5, max_links: int = MAX_LINKS,
                 max_communicators: int = MAX_COMMUNICATORS) -> None:
        self.names = names
        self.interval = interval
        self.history = history
        self.max_links = max_links
        self.max_communicators = max_communicators
        self.snapshot = DashboardSnapshot(0.0)
        self._stalls: dict[tuple[uuid.UUID, uuid.UUID | None], Stall] = {}
        self._ended: collections.deque[Stall] = collections.deque(maxlen=stall_log)
        self._link_history: dict[tuple[uuid.UUID, uuid.UUID], History] = {}
        self._communicator_history: dict[uuid.UUID, History] = {}
        self._samples = 0  # samples recorded (the histories' clock)

    # -- between samples ---------------------------------------------------------------------

    def observe(self, stats: Mapping[uuid.UUID, CommunicatorStatistics],
                now: float) -> DashboardSnapshot:
        """One sample (each communicator's statistics, taken at ``now``, ``time.time()``)
        with its links and waits; the log of waits is brought up to date."""
        waits: dict[tuple[uuid.UUID, uuid.UUID | None], tuple[str, float]] = {}
        for ident, snapshot in stats.items():
            for row in snapshot.peers:
                if row.blocked:
                    waits[(ident, row.peer)] = (row.blocked, row.blocked_for)
            if snapshot.get_waiting:
                waits[(ident, None)] = (snapshot.get_waiting, 0.0)
        for key, (reason, seconds) in waits.items():
            stall = self._stalls.get(key)
            if stall is None or stall.reason != reason:
                if stall is not None:
                    stall.ended = now
                    self._ended.appendleft(stall)
                self._stalls[key] = Stall(key[0], key[1], reason, now - seconds)
        for key in [key for key in self._stalls if key not in waits]:
            stall = self._stalls.pop(key)
            stall.ended = now
            self._ended.appendleft(stall)
        return DashboardSnapshot(now, dict(stats), find_links(stats),
                                 sorted(self._stalls.values(), key=lambda s: s.started),
                                 list(self._ended))


    def record(self, snapshot: DashboardSnapshot
               ) -> dict[tuple[uuid.UUID, uuid.UUID], LinkFigures]:
        """Add ``snapshot`` to the histories; its links' figures."""
        figures = {(link.a, link.b): LinkFigures.of(link) for link in snapshot.links}
        self._record_history(snapshot, figures)
        self._samples += 1
        return figures

    def _record_history(self, snapshot: DashboardSnapshot,
                        figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures]) -> None:
        """Append this tick to every link's and communicator's history; forget those not
        seen for a whole history window (so memory stays bounded whatever the run time)."""
        tick = self._samples
        for key, figure in figures.items():
            entry = self._link_history.get(key)
            if entry is None:
                entry = self._link_history[key] = History(self.history)
            entry.add(tick, (figure.forward_bytes, figure.back_bytes,
                             float(figure.forward_queued + figure.back_queued)))
        for ident, stats in snapshot.communicators.items():
            node = self._communicator_history.get(ident)
            if node is None:
                node = self._communicator_history[ident] = History(self.history)
            node.add(tick, (stats.bytes_in_per_s, stats.bytes_out_per_s))
        _forget_older(self._link_history, tick - self.history)
        _forget_older(self._communicator_history, tick - self.history)

    def link_history(self, a: uuid.UUID, b: uuid.UUID) -> list[tuple[float, ...] | None]:
        """The samples kept for the link from ``a`` to ``b`` (bytes/s →, bytes/s ←, queued
        messages; None where it was missing), oldest first; [] once forgotten."""
        entry = self._link_history.get((a, b))
        return list(entry.samples) if entry is not None else []

    @property
    def tracked_links(self) -> int:
        """How many links have a history kept (those seen within the history window)."""
        return len(self._link_history)

    # -- what the view shows -------------------------------------------------------------------

    def name(self, ident: uuid.UUID) -> str:
        """A communicator's (or outside peer's) display name: its name in ``names``, else
        its role and :func:`~netq.display.tables.peer_name` (``server 1a2b3c4d``)."""
        given = self.names.get(ident)
        if given is not None:
            return given
        snapshot = self.snapshot.communicators.get(ident)
        role = "peer" if snapshot is None else snapshot.purpose
        return f"{role} {peer_name(ident)}"

    def named(self, text: str) -> str:
        """``text`` (a sentence of ``statistics()``) with every id in it written as its
        display name (:func:`netq.display.tables.with_names` with this dashboard's name table)."""
        found = {uuid.UUID(match) for match in _UUID.findall(text)}
        return with_names(text, {ident: self.name(ident) for ident in found}) if found else text

    def badge(self, snapshot: DashboardSnapshot, live: bool, *, frozen: str | None = None,
              stopped: bool = False) -> str:
        """The badge's ``data-state``: while live, ``waiting`` (any wait), ``cannot-connect``,
        ``closed`` (every communicator) or ``open``; in a static form ``frozen`` (the state a
        frozen view keeps) if given, else ``closed``, ``stopped`` or ``snapshot``."""
        stats = snapshot.communicators.values()
        any_open = any(s.state != "closed" for s in stats)
        if not live:
            return static_badge(bool(snapshot.communicators) and not any_open,
                                frozen or ("stopped" if stopped else None))
        words = {communicator_state(s) for s in stats}
        if snapshot.active_stalls or "waiting" in words:
            return "waiting"
        if "cannot connect" in words:
            return "cannot-connect"
        if snapshot.communicators and not any_open:
            return "closed"
        return "open"

    def static_header(self, snapshot: DashboardSnapshot, state: str,
                      reason: str | None = None) -> dict[str, Any]:
        """The fields that make a view a static form: not live, its badge (``state``), and
        the sentence saying when the figures were taken and why they are not live
        (:func:`netq.display.view_model.snapshot_sentence`)."""
        return {"live": False, "state": state, "state_label": state,
                "snapshot": snapshot_sentence(state, snapshot.taken, reason)}

    def view(self, figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures] | None = None,
             *, live: bool = False, frozen: str | None = None,
             stopped: bool = False) -> dict[str, Any]:
        """The JSON document the live view draws (and the static forms render): every
        figure formatted, the rows to show, the sparklines (integers 0..100 of each row's
        maximum, which is given formatted), the map's layout and the waits."""
        snap = self.snapshot
        if figures is None:
            figures = {(link.a, link.b): LinkFigures.of(link) for link in snap.links}
        stats = snap.communicators
        open_count = sum(1 for s in stats.values() if s.state != "closed")
        total = sum(figure.bytes_per_s for figure in figures.values())
        waiting = len(snap.active_stalls)
        state = self.badge(snap, live, frozen=frozen, stopped=stopped)
        view: dict[str, Any] = {
            "live": live, "state": state, "state_label": state.replace("-", " "),
            "taken": clock(snap.taken), "clock": f"sampled {clock(snap.taken)}",
            "interval_ms": round(self.interval * 1000), "snapshot": "",
            # the view stops claiming to be live after this long without an update
            "stale_after_ms": round(max(10.0, 5 * self.interval) * 1000),
            "facts": [f"{len(stats)} communicator{_plural(len(stats))} ({open_count} open)",
                      f"{len(snap.links)} link{_plural(len(snap.links))}, "
                      f"{format_byte_rate(total)}",
                      f"{waiting} waiting"],
            "empty": "" if stats else ("No communicator in this kernel yet: create one with "
                                       "netq.new(...) and this view lists it."),
            "map": map_layout(self.snapshot, figures, self.name),
            **self._communicator_rows(),
            **self._link_rows(figures),
            "stalls": self._stalls_view(),
        }
        if not live:
            view.update(self.static_header(snap, state))
        return view

    def _communicator_rows(self) -> dict[str, Any]:
        stats = self.snapshot.communicators
        order = sorted(stats.items(), key=lambda item: (
            communicator_state(item[1]) != "waiting",
            -(item[1].bytes_in_per_s + item[1].bytes_out_per_s), self.name(item[0])))
        rows = []
        for ident, snapshot in order[:self.max_communicators]:
            word = communicator_state(snapshot)
            note = "; ".join(self.named(text) for text in (snapshot.get_waiting,
                                                          snapshot.connect_error) if text)
            history = self._communicator_history.get(ident)
            # a closed communicator's rates are those of its last seconds: not shown as current
            gone = snapshot.state == "closed"
            rows.append({
                "name": self.name(ident), "role": snapshot.purpose,
                "transport": snapshot.protocol.upper(),
                "address": format_address(snapshot.address),
                "state": word.replace(" ", "-"), "state_label": word,
                "uptime": format_duration(snapshot.uptime), "peers": len(snapshot.peers),
                "in_rate": "-" if gone else format_byte_rate(snapshot.bytes_in_per_s),
                "in_msgs": "" if gone else f"{format_count(snapshot.messages_in_per_s)} msg/s",
                "out_rate": "-" if gone else format_byte_rate(snapshot.bytes_out_per_s),
                "out_msgs": "" if gone else f"{format_count(snapshot.messages_out_per_s)} msg/s",
                "received": _budget(snapshot.recv_held, snapshot.recv_budget),
                "memory": _budget(snapshot.memory, memory_budget(snapshot)),
                "note": note,
                "spark": history.sparkline((0, 1), format_byte_rate) if history
                else _no_history(2, format_byte_rate),
            })
        rest = order[self.max_communicators:]
        more = None
        if rest:
            more = {"count": len(rest),
                    "in_rate": format_byte_rate(sum(s.bytes_in_per_s for _, s in rest)),
                    "out_rate": format_byte_rate(sum(s.bytes_out_per_s for _, s in rest)),
                    "open": sum(1 for _, s in rest if s.state != "closed")}
        return {"communicators": rows, "communicators_more": more}

    def _link_rows(self, figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures]
                   ) -> dict[str, Any]:
        stats = self.snapshot.communicators
        order = sorted(self.snapshot.links, key=lambda link: (
            not link.blocked, -figures[(link.a, link.b)].bytes_per_s,
            self.name(link.a), self.name(link.b)))
        rows = []
        negative = False
        for link in order[:self.max_links]:
            figure = figures[(link.a, link.b)]
            a, b = self.name(link.a), self.name(link.b)
            credits = (figure.forward_credit, figure.back_credit)
            negative_here = any(c is not None and c < 0 for c in credits)
            negative = negative or negative_here
            history = self._link_history.get((link.a, link.b))
            rows.append({
                "key": f"{a}→{b}", "a": a, "b": b, "state": link.state or "-",
                "outside": link.a not in stats or link.b not in stats,
                "waiting": bool(link.blocked),
                "reason": self.named(link.blocked),
                "waited": format_duration(link.blocked_for) if link.blocked else "",
                "forward_rate": format_byte_rate(figure.forward_bytes),
                "forward_msgs": f"{format_count(figure.forward_messages)} msg/s",
                "forward_total": f"{format_count(figure.forward_total)} msgs",
                "back_rate": format_byte_rate(figure.back_bytes),
                "back_msgs": f"{format_count(figure.back_messages)} msg/s",
                "back_total": f"{format_count(figure.back_total)} msgs",
                "queued": f"{format_count(figure.forward_queued)} / "
                          f"{format_count(figure.back_queued)}",
                "credit_forward": "-" if credits[0] is None else format_bytes(credits[0]),
                "credit_back": "-" if credits[1] is None else format_bytes(credits[1]),
                "credit_negative": negative_here,
                "spark_rate": history.sparkline((0, 1), format_byte_rate) if history
                else _no_history(2, format_byte_rate),
                "spark_queued": history.sparkline((2,), _format_messages) if history
                else _no_history(1, _format_messages),
            })
        rest = [figures[(link.a, link.b)] for link in order[self.max_links:]]
        more = None
        if rest:
            more = {"count": len(rest),
                    "forward_rate": format_byte_rate(sum(f.forward_bytes for f in rest)),
                    "back_rate": format_byte_rate(sum(f.back_bytes for f in rest)),
                    "queued": f"{format_count(sum(f.forward_queued for f in rest))} / "
                              f"{format_count(sum(f.back_queued for f in rest))}",
                    "waiting": sum(1 for link in order[self.max_links:] if link.blocked)}
        return {"links": rows, "links_more": more,
                "credit_note": NEGATIVE_CREDIT if negative else ""}

    def _stall_line(self, stall: Stall) -> dict[str, str]:
        who = (f"{self.name(stall.communicator)} → {self.name(stall.peer)}"
               if stall.peer is not None else f"{self.name(stall.communicator)}: get()")
        return {"key": f"{who}/{stall.started:.3f}", "link": who,
                "reason": self.named(stall.reason), "since": clock(stall.started),
                "lasted": format_duration(stall.seconds)}

    def _stalls_view(self) -> dict[str, Any]:
        active = self.snapshot.active_stalls
        longest = sorted(active, key=lambda stall: stall.started)[:MAX_STALLS]
        return {"active": [self._stall_line(stall) for stall in longest],
                "active_more": max(0, len(active) - MAX_STALLS),
                "ended": [self._stall_line(stall) for stall in self.snapshot.recent_stalls]}



def _forget_older(table: dict[Any, History], oldest_tick: int) -> None:
    """Drop the histories last seen at or before ``oldest_tick`` (out of the window)."""
    for key in [key for key, entry in table.items() if entry.last_tick <= oldest_tick]:
        del table[key]


def _no_history(lines: int, formatter) -> dict[str, Any]:
    return {"series": [[] for _ in range(lines)], "max": formatter(0), "size": 2}


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _format_messages(value: float) -> str:
    return f"{format_count(value)} queued"


def _budget(used: int, budget: int) -> dict[str, Any]:
    """``1.5 MiB of 64.0 MiB`` and the fraction used (for a bar; ``high`` past 90 %)."""
    if budget <= 0:
        return {"text": format_bytes(used), "fraction": 0.0, "high": False}
    fraction = min(1.0, max(0.0, used / budget))
    return {"text": f"{format_bytes(used)} of {format_bytes(budget)}",
            "fraction": round(fraction, 4), "high": fraction > 0.9}




