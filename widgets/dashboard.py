"""The kernel-wide dashboard: every communicator of this kernel and every link between them.

``netq.widgets.dashboard()`` shows, at ``1 / interval`` Hz:

* a map: one box per communicator (servers on the left, clients on the right, peers in other
  processes in grey), one line per link, its width growing with the bytes per second it carries
  and red while its traffic waits; past :data:`MAP_NODES` boxes a side, the quietest are folded
  into one ``+N more`` box;
* one row per communicator: role, transport, address, state, peers, rates with their recent
  history, and its budgets in use (received and not yet taken out of the receive budget;
  memory held);
* one row per link, the busiest first (waiting ones before all): both directions' rates and
  their history, queued messages and their history, credit; past ``max_links`` rows, one
  aggregate row for the rest;
* the waits as they happen, one line each (which link, since when, why: the sentence
  ``statistics()`` gives and netq logs as a WARNING, with display names instead of ids; the
  whole sentence on expanding it), and the last waits that ended.

The live view is an anywidget widget (:class:`DashboardWidget`): ``frontend/dashboard.js``
draws one synced trait, ``view``, a JSON document Python computes from the snapshot (every
figure already formatted by :mod:`netq.display`). One thread (``netq-dashboard``) samples every
communicator's ``statistics()`` and sets it. It ends when no communicator has been open for
``idle_stop`` seconds (at once once every communicator it saw has closed, after showing them
closed) or on :meth:`Dashboard.stop`; the view then says it is a snapshot (``data-live="0"``).
:meth:`Dashboard.static_html` draws the same document without a script (the saved page, the
``text/html`` form beside the widget, and what replaces the widget in a notebook's output once
the dashboard stops).

What a tick sees (links, waits, histories) is :mod:`netq.widgets.dashboard_model`; the static
HTML form is drawn by :mod:`netq.widgets.dashboard_html`.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import traitlets

from ..display.formatting import (
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_duration,
)
from ..display.tables import with_names
from ..display.view_model import FinalPicture, clock, snapshot_sentence
from ..live import live_communicators
from ..statistics import CommunicatorStatistics
from .dashboard_html import FRONTEND, render_html, render_text
from .dashboard_model import (
    HISTORY,
    MAP_NODES,
    DashboardSnapshot,
    History,
    Link,
    LinkFigures,
    Stall,
    communicator_state,
    find_links,
    map_layout,
)
from .replaceable import LiveWidget, ReplaceableView
from .sampler import view_thread_class

__all__ = ("Dashboard", "DashboardWidget", "dashboard", "Link", "Stall", "DashboardSnapshot",
           "HISTORY", "MAX_LINKS", "MAX_COMMUNICATORS", "MAP_NODES", "MAX_STALLS")

LOGGER = logging.getLogger("netq.widgets")
DEFAULT_INTERVAL = 1.0  # seconds
MAX_LINKS = 12  # link rows shown; the others are summed in one aggregate row
MAX_COMMUNICATORS = 10  # communicator rows shown; likewise
MAX_STALLS = 8  # ongoing waits listed one by one; the rest are counted
NEGATIVE_CREDIT = ("credit may dip below zero by up to one message: a message may start on any "
                   "positive credit, and its whole size is taken from it")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Badge states a view that is no longer live may wear (the DOM contract of the live views).
STATIC_STATES = frozenset({"snapshot", "stopped", "closed"})


class DashboardWidget(LiveWidget):
    """The dashboard's live view in any frontend with a widget manager (JupyterLab,
    Notebook 7, Voila, VS Code, marimo). ``view``: the JSON document
    ``frontend/dashboard.js`` draws (see :meth:`Dashboard.view`)."""

    _esm = FRONTEND / "dashboard.js"
    _css = FRONTEND / "dashboard.css"
    view = traitlets.Dict().tag(sync=True)
    data_traits = ("view",)


class Dashboard(ReplaceableView):
    """A live view of every communicator in this kernel. Use :func:`dashboard`.

    ``interval``: seconds between samples. ``names``: display names by communicator id (or
    peer id, for peers in other processes); default: ``server 1a2b3c4d``; read at each tick,
    so it may grow. ``idle_stop``: seconds with no open communicator before the thread ends.
    ``history``: samples kept per link and per communicator for the sparklines (bounded
    whatever the run time; a link that left is forgotten once it is out of that window).
    ``stall_log``: ended waits listed. ``max_links`` / ``max_communicators``: rows shown, the
    busiest (and waiting) first, the rest summed in one row. ``start``: start the thread now
    (None: when displayed).
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL, *,
                 names: Mapping[uuid.UUID, str] | None = None, idle_stop: float = 30.0,
                 history: int = HISTORY, stall_log: int = 5, max_links: int = MAX_LINKS,
                 max_communicators: int = MAX_COMMUNICATORS,
                 start: bool | None = None) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive (seconds)")
        if history < 2 or max_links < 1 or max_communicators < 1:
            raise ValueError("history must be at least 2 samples, max_links and "
                             "max_communicators at least 1")
        self.interval = interval
        self.names = names if names is not None else {}
        self.idle_stop = idle_stop
        self.history = history
        self.max_links = max_links
        self.max_communicators = max_communicators
        self._lock = threading.RLock()
        self._stalls: dict[tuple[uuid.UUID, uuid.UUID | None], Stall] = {}
        self._ended: collections.deque[Stall] = collections.deque(maxlen=stall_log)
        self._link_history: dict[tuple[uuid.UUID, uuid.UUID], History] = {}
        self._communicator_history: dict[uuid.UUID, History] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopped = False
        self.ticks = 0  # samples taken by the thread
        self._samples = 0  # samples taken by anyone (the history's clock)
        self.cpu_seconds = 0.0  # CPU time of the sampling thread (time.thread_time)
        self.wall_seconds = 0.0
        self.errors: collections.deque[BaseException] = collections.deque(maxlen=20)
        self.widget = DashboardWidget()
        self.snapshot = DashboardSnapshot(time.time())
        # The last live pictures (snapshot, view), for the one kept when all have closed.
        self._final: FinalPicture[tuple[DashboardSnapshot, dict[str, Any]]] = FinalPicture()
        # Once frozen: the badge word and the static bundle, computed once from one sample.
        self._frozen_state: str | None = None
        self._frozen_bundle: dict[str, str] = {}
        self.update()
        if start:
            self.start()

    # -- sampling ----------------------------------------------------------------------------

    def sample(self) -> DashboardSnapshot:
        """Take one snapshot of every communicator (and update the log of waits)."""
        stats: dict[uuid.UUID, CommunicatorStatistics] = {}
        for communicator in live_communicators():
            try:
                stats[communicator.id] = communicator.statistics()
            except Exception as error:  # noqa: BLE001 - one broken communicator hides none
                self.errors.append(error)
        now = time.time()
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
        return DashboardSnapshot(now, stats, find_links(stats),
                                 sorted(self._stalls.values(), key=lambda s: s.started),
                                 list(self._ended))

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

    def update(self) -> None:
        """Sample and show (what the thread does each tick); nothing once frozen."""
        with self._lock:
            if self._frozen_state is not None:
                return
            self.snapshot = self.sample()
            figures = {(link.a, link.b): LinkFigures.of(link) for link in self.snapshot.links}
            self._record_history(self.snapshot, figures)
            self._samples += 1
            view = self.view(figures, live=self.running)
            self.widget.view = view
            still_open = _open_count(self.snapshot)
            if still_open:
                self._final.add((self.snapshot, view), still_open)

    def _freeze_locked(self, state: str) -> None:
        """Keep one picture for good: the newest, or (``closed``) the last one before the
        communicators began closing. Holds ``self._lock``."""
        self._stopped = True
        picture = self._final.final() if state == "closed" else None
        reason = {"snapshot": "frozen", "stopped": "the dashboard was stopped",
                  "closed": "every communicator closed"}[state]
        if picture is None:
            snapshot, view = self.snapshot, self.view(live=False)
        else:
            snapshot, view = picture
            reason = "every communicator closed after it"
        view = dict(view)
        view.update(self._static_header(snapshot, state, reason))
        self.snapshot = snapshot
        self._keep(state, {"text/plain": render_text(view), "text/html": render_html(view)})
        self.widget.view = view

    def _end_sampling(self) -> None:
        """End the sampling thread (within one interval) and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def start(self) -> Dashboard:
        """Start the sampling thread (idempotent); a frozen view is live again."""
        if self.running:
            self._stopped = False
            return self
        self._thaw()
        self._stop.clear()
        self._thread = view_thread_class()(target=self._run, name="netq-dashboard", daemon=True)
        self._thread.start()
        self.update()  # the view says live from now on
        self._show_live()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def view_state(self) -> str:
        """What the badge of the view says now (``open``, ``waiting``, ..., ``snapshot``,
        ``stopped``, ``closed``; see :meth:`view`)."""
        return self._frozen_state or self._badge(self.snapshot, live=self.running)

    def link_history(self, a: uuid.UUID, b: uuid.UUID) -> list[tuple[float, ...] | None]:
        """The samples kept for the link from ``a`` to ``b`` (bytes/s →, bytes/s ←, queued
        messages; None where it was missing), oldest first; [] once forgotten."""
        with self._lock:
            entry = self._link_history.get((a, b))
            return list(entry.samples) if entry is not None else []

    @property
    def tracked_links(self) -> int:
        """How many links have a history kept (those seen within the history window)."""
        return len(self._link_history)

    def cpu_fraction(self) -> float:
        """CPU time of the sampling thread / its wall-clock lifetime (1.0 = one core)."""
        return self.cpu_seconds / max(self.wall_seconds, 1e-9)

    def cpu_per_tick(self) -> float:
        """Seconds of CPU the sampling thread spent per sample (0 before the first)."""
        return self.cpu_seconds / self.ticks if self.ticks else 0.0

    def _run(self) -> None:
        cpu_start, wall_start = time.thread_time(), time.monotonic()
        idle_since: float | None = None
        seen_open = False
        try:
            while not self._stop.wait(self.interval):
                if getattr(threading.current_thread(), "should_exit", False):
                    break  # marimo re-ran or deleted the cell that started it
                try:
                    self.update()
                except Exception as error:  # noqa: BLE001 - never print from a thread
                    self.errors.append(error)
                    LOGGER.debug("netq dashboard: %r", error, exc_info=error)
                self.ticks += 1
                self.cpu_seconds = time.thread_time() - cpu_start
                self.wall_seconds = time.monotonic() - wall_start
                states = [s.state for s in self.snapshot.communicators.values()]
                if any(state != "closed" for state in states):
                    seen_open, idle_since = True, None
                    continue
                now = time.monotonic()
                idle_since = idle_since if idle_since is not None else now
                if seen_open or now - idle_since >= self.idle_stop:
                    break
        finally:
            self._stop.set()
            try:
                self._finish()
            except Exception as error:  # noqa: BLE001 - never print from a thread
                self.errors.append(error)
            self.cpu_seconds = time.thread_time() - cpu_start
            self.wall_seconds = time.monotonic() - wall_start

    def _finish(self) -> None:
        """The thread ended: the view freezes (once every communicator closed, on the last
        picture before they began closing), and in a notebook its output gives way to the
        static form."""
        with self._lock:
            if self._frozen_state is None:
                communicators = self.snapshot.communicators
                closed = bool(communicators) and not _open_count(self.snapshot)
                self._freeze_locked("closed" if closed else "stopped")
        self._show_static()

    # -- what the view shows ---------------------------------------------------------------

    def name(self, ident: uuid.UUID) -> str:
        """A communicator's (or outside peer's) display name."""
        given = self.names.get(ident)
        if given is not None:
            return given
        snapshot = self.snapshot.communicators.get(ident)
        if snapshot is None:
            return f"peer {str(ident)[:8]}"
        return f"{snapshot.purpose} {str(ident)[:8]}"

    def named(self, text: str) -> str:
        """``text`` (a sentence of ``statistics()``) with every id in it written as its
        display name (:func:`netq.display.tables.with_names` with this dashboard's name table)."""
        found = {uuid.UUID(match) for match in _UUID.findall(text)}
        return with_names(text, {ident: self.name(ident) for ident in found}) if found else text

    def _badge(self, snapshot: DashboardSnapshot, live: bool) -> str:
        stats = snapshot.communicators.values()
        any_open = any(s.state != "closed" for s in stats)
        if not live:
            if self._frozen_state is not None:
                return self._frozen_state
            if snapshot.communicators and not any_open:
                return "closed"
            ended = self._thread is not None and not self.running
            return "stopped" if self._stopped or ended else "snapshot"
        words = {communicator_state(s) for s in stats}
        if snapshot.active_stalls or "waiting" in words:
            return "waiting"
        if "cannot connect" in words:
            return "cannot-connect"
        if snapshot.communicators and not any_open:
            return "closed"
        return "open"

    def _static_header(self, snapshot: DashboardSnapshot, state: str | None = None,
                       reason: str | None = None) -> dict[str, Any]:
        """The fields that make a view a static form: not live, its badge, and the sentence
        saying when the figures were taken (:func:`netq.display.view_model.snapshot_sentence`)."""
        state = state or self._badge(snapshot, live=False)
        return {"live": False, "state": state, "state_label": state,
                "snapshot": snapshot_sentence(state, snapshot.taken, reason)}

    def view(self, figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures] | None = None,
             *, live: bool = False) -> dict[str, Any]:
        """The JSON document the live view draws (and :meth:`static_html` renders): every
        figure formatted, the rows to show, the sparklines (integers 0..100 of each row's
        maximum, which is given formatted), the map's layout and the waits."""
        snap = self.snapshot
        if figures is None:
            figures = {(link.a, link.b): LinkFigures.of(link) for link in snap.links}
        stats = snap.communicators
        open_count = sum(1 for s in stats.values() if s.state != "closed")
        total = sum(figure.bytes_per_s for figure in figures.values())
        waiting = len(snap.active_stalls)
        state = self._badge(snap, live)
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
            view.update(self._static_header(snap))
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
                "memory": _budget(snapshot.memory,
                                  snapshot.recv_budget + snapshot.send_budget),
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

    # -- static forms and display ------------------------------------------------------------

    @property
    def html(self) -> str:
        """:meth:`static_html`: what a page without a widget manager shows."""
        return self.static_html()

    def to_html(self) -> str:
        """A standalone HTML page of the current snapshot (no script, no network)."""
        return ('<!DOCTYPE html><html><head><meta charset="utf-8"><meta name="viewport" '
                'content="width=device-width"><title>netq dashboard</title></head><body>'
                f'{self.static_html()}</body></html>')

    def save(self, path) -> None:
        """Write :meth:`Dashboard.to_html` to ``path`` (UTF-8)."""
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.to_html())

    def _current_bundle(self) -> dict[str, str]:
        view = dict(self.widget.view)
        view.update(self._static_header(self.snapshot))
        return {"text/plain": render_text(view), "text/html": render_html(view)}

    def _display_(self) -> DashboardWidget:
        """marimo's display hook: the live widget (marimo draws anywidgets itself and relays
        trait changes made on the sampling thread through the comm the widget opened in the
        cell); the thread starts unless :meth:`stop` was called. Once the dashboard is not
        live, the same widget draws its static form."""
        if not self._stopped:
            self.start()
        return self.widget


def _open_count(snapshot: DashboardSnapshot) -> int:
    """Communicators not closed: the dashboard's size for :class:`FinalPicture`."""
    return sum(1 for stats in snapshot.communicators.values() if stats.state != "closed")


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




def dashboard(interval: float = DEFAULT_INTERVAL, **options) -> Dashboard:
    """A live view of every communicator in this kernel and the links between them.

    Display it (a cell's last expression, in Jupyter or marimo); ``.stop()`` ends its
    thread, ``.save(path)`` writes a static HTML snapshot. Options: see :class:`Dashboard`.
    """
    return Dashboard(interval, **options)
