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
"""

from __future__ import annotations

import collections
import html
import logging
import math
import pathlib
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import traitlets

from ..communicator import live_communicators
from ..display.formatting import (
    format_address,
    format_byte_rate,
    format_bytes,
    format_count,
    format_duration,
)
from ..display.tables import title_state, with_names
from ..statistics import CommunicatorStatistics, PeerStatistics
from .replaceable import LiveWidget, ReplaceableView
from .sampler import view_thread_class

__all__ = ("Dashboard", "DashboardWidget", "dashboard", "Link", "Stall", "DashboardSnapshot",
           "HISTORY", "MAX_LINKS", "MAX_COMMUNICATORS", "MAP_NODES", "MAX_STALLS")

LOGGER = logging.getLogger("netq.widgets")
DEFAULT_INTERVAL = 1.0  # seconds
HISTORY = 120  # samples kept per link and per communicator (2 minutes at the default 1 Hz)
MAX_LINKS = 12  # link rows shown; the others are summed in one aggregate row
MAX_COMMUNICATORS = 10  # communicator rows shown; likewise
MAP_NODES = 10  # boxes per side of the map; the quietest others are folded into one box
MAX_STALLS = 8  # ongoing waits listed one by one; the rest are counted
SPARK_SCALE = 100  # sparkline points travel as integers 0..SPARK_SCALE of the row's maximum
NEGATIVE_CREDIT = ("credit may dip below zero by up to one message: a message may start on any "
                   "positive credit, and its whole size is taken from it")
FRONTEND = pathlib.Path(__file__).parent / "frontend"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Badge states a view that is no longer live may wear (the DOM contract of the live views).
STATIC_STATES = frozenset({"snapshot", "stopped", "closed"})


@dataclass(frozen=True)
class Link:
    """One connection as seen from one or both of its ends (``a`` is the server's side where
    the server is in this kernel). ``a_row`` / ``b_row``: that end's row for the other
    (None when that end is in another process)."""
    a: uuid.UUID
    b: uuid.UUID
    a_row: PeerStatistics | None
    b_row: PeerStatistics | None

    @property
    def rows(self) -> tuple[PeerStatistics, ...]:
        return tuple(row for row in (self.a_row, self.b_row) if row is not None)

    @property
    def bytes_per_s(self) -> float:
        """Bytes per second carried, both directions, as the better-informed end counts."""
        row = self.a_row or self.b_row
        return 0.0 if row is None else row.bytes_in_per_s + row.bytes_out_per_s

    @property
    def blocked(self) -> str:
        return "; ".join(row.blocked for row in self.rows if row.blocked)

    @property
    def blocked_for(self) -> float:
        """Seconds the longest of its waits has lasted (0 while its traffic flows)."""
        return max((row.blocked_for for row in self.rows if row.blocked), default=0.0)

    @property
    def state(self) -> str:
        row = self.a_row or self.b_row
        return "" if row is None else row.state


class LinkFigures(NamedTuple):
    """A link's figures in the direction of its arrow (→ is from ``a`` to ``b``): bytes and
    messages per second, messages in total, queued messages (unsent at the sender plus not yet
    taken by ``get()`` at the receiver, where that end is known) and credit in bytes."""
    forward_bytes: float
    back_bytes: float
    forward_messages: float
    back_messages: float
    forward_total: int
    back_total: int
    forward_queued: int
    back_queued: int
    forward_credit: int | None
    back_credit: int | None

    @classmethod
    def of(cls, link: Link) -> LinkFigures:
        a, b = link.a_row, link.b_row
        if a is not None:
            forward = (a.bytes_out_per_s, a.messages_out_per_s, a.messages_out)
            back = (a.bytes_in_per_s, a.messages_in_per_s, a.messages_in)
        elif b is not None:
            forward = (b.bytes_in_per_s, b.messages_in_per_s, b.messages_in)
            back = (b.bytes_out_per_s, b.messages_out_per_s, b.messages_out)
        else:
            forward = back = (0.0, 0.0, 0)
        forward_queued = (a.queue_out if a else 0) + (b.queue_in if b else 0)
        back_queued = (a.queue_in if a else 0) + (b.queue_out if b else 0)
        forward_credit = a.credit_out if a else b.credit_in if b else None
        back_credit = b.credit_out if b else a.credit_in if a else None
        return cls(forward[0], back[0], forward[1], back[1], int(forward[2]), int(back[2]),
                   forward_queued, back_queued, forward_credit, back_credit)

    @property
    def bytes_per_s(self) -> float:
        return self.forward_bytes + self.back_bytes


@dataclass
class Stall:
    """A wait: on a link (``peer`` is the other end) or, with ``peer`` None, a ``get()`` of
    ``communicator`` that waits. Why, from when (``time.time()``) and for how long."""
    communicator: uuid.UUID
    peer: uuid.UUID | None
    reason: str
    started: float
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.time()) - self.started


@dataclass
class DashboardSnapshot:
    """What one tick saw: each communicator's statistics (by id), the links, the waits."""
    taken: float  # time.time()
    communicators: dict[uuid.UUID, CommunicatorStatistics] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    active_stalls: list[Stall] = field(default_factory=list)
    recent_stalls: list[Stall] = field(default_factory=list)


def find_links(stats: Mapping[uuid.UUID, CommunicatorStatistics]) -> list[Link]:
    """Pair the two ends of every connection between communicators of this kernel (a peer's
    id is the other end's communicator id); a peer in another process is a one-ended link.
    A connection that every known end reports ``closed`` is over and not listed (a closed
    communicator still lists its former peers as long as it is referenced)."""
    links: dict[frozenset[uuid.UUID], Link] = {}
    over: set[frozenset[uuid.UUID]] = set()
    for ident, snapshot in stats.items():
        for row in snapshot.peers:
            key = frozenset((ident, row.peer))
            if key in links or key in over:
                continue
            other = stats.get(row.peer)
            other_row = None
            if other is not None:
                other_row = next((r for r in other.peers if r.peer == ident), None)
            if all(end.state == "closed" for end in (row, other_row) if end is not None):
                over.add(key)
            elif snapshot.purpose == "client" and other is not None:
                links[key] = Link(row.peer, ident, other_row, row)
            else:
                links[key] = Link(ident, row.peer, row, other_row)
    return sorted(links.values(), key=lambda link: (str(link.a), str(link.b)))


def communicator_state(stats: CommunicatorStatistics) -> str:
    """The word a communicator's badge shows: :func:`netq.display.tables.title_state`, and
    ``waiting`` also while one of its ``get()`` calls waits."""
    word = title_state(stats)
    if word in ("open", "connecting") and stats.get_waiting:
        return "waiting"
    return word


class _History:
    """The last ``size`` samples of one link or communicator (tuples of floats) and the tick
    it was last seen at. A tick it missed is a gap (None) when it shows up again."""
    __slots__ = ("samples", "last_tick")

    def __init__(self, size: int) -> None:
        self.samples: collections.deque[tuple[float, ...] | None] = collections.deque(
            maxlen=size)
        self.last_tick = -1

    def add(self, tick: int, values: tuple[float, ...]) -> None:
        if self.last_tick >= 0:
            for _ in range(min(tick - self.last_tick - 1, self.samples.maxlen or 0)):
                self.samples.append(None)
        self.samples.append(values)
        self.last_tick = tick

    def sparkline(self, indices: Iterable[int], formatter) -> dict[str, Any]:
        """The series at ``indices`` as integers 0..SPARK_SCALE of their common maximum
        (None: a gap), and that maximum formatted (what the top of the sparkline means)."""
        indices = tuple(indices)
        top = max((sample[i] for sample in self.samples if sample is not None
                   for i in indices), default=0.0)
        scale = SPARK_SCALE / top if top > 0 else 0.0
        series = [[None if sample is None else round(sample[i] * scale)
                   for sample in self.samples] for i in indices]
        return {"series": series, "max": formatter(top), "size": self.samples.maxlen}


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
        self._link_history: dict[tuple[uuid.UUID, uuid.UUID], _History] = {}
        self._communicator_history: dict[uuid.UUID, _History] = {}
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
                entry = self._link_history[key] = _History(self.history)
            entry.add(tick, (figure.forward_bytes, figure.back_bytes,
                             float(figure.forward_queued + figure.back_queued)))
        for ident, stats in snapshot.communicators.items():
            node = self._communicator_history.get(ident)
            if node is None:
                node = self._communicator_history[ident] = _History(self.history)
            node.add(tick, (stats.bytes_in_per_s, stats.bytes_out_per_s))
        _forget_older(self._link_history, tick - self.history)
        _forget_older(self._communicator_history, tick - self.history)

    def update(self) -> None:
        """Sample and show (what the thread does each tick)."""
        with self._lock:
            self.snapshot = self.sample()
            figures = {(link.a, link.b): LinkFigures.of(link) for link in self.snapshot.links}
            self._record_history(self.snapshot, figures)
            self._samples += 1
            self.widget.view = self.view(figures, live=self.running)

    def start(self) -> Dashboard:
        """Start the sampling thread (idempotent)."""
        self._stopped = False
        if self.running:
            return self
        self._stop.clear()
        self._thread = view_thread_class()(target=self._run, name="netq-dashboard", daemon=True)
        self._thread.start()
        self.update()  # the view says live from now on
        self._show_live()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop sampling (the thread ends within one interval) and show the static form."""
        self._stopped = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self.update()
        self._show_static()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def view_state(self) -> str:
        """What the badge of the view says now (``open``, ``waiting``, ..., ``stopped``,
        ``closed``; see :meth:`view`)."""
        return self._badge(self.snapshot, live=self.running)

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
        """The thread ended: the live view says so (last figures, not live), and in a
        notebook its output gives way to the static form."""
        with self._lock:
            view = dict(self.widget.view)
            view.update(self._static_header(self.snapshot))
            self.widget.view = view
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

    def _static_header(self, snapshot: DashboardSnapshot) -> dict[str, Any]:
        """The fields that make a view a static form: not live, its badge, and the sentence
        saying when the figures were taken."""
        state = self._badge(snapshot, live=False)
        taken = _clock(snapshot.taken)
        why = {"closed": ": every communicator closed", "stopped": ": the dashboard stopped",
               "snapshot": ""}[state]
        return {"live": False, "state": state, "state_label": state,
                "snapshot": f"snapshot taken {taken}, not live{why}"}

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
            "taken": _clock(snap.taken), "clock": f"sampled {_clock(snap.taken)}",
            "interval_ms": round(self.interval * 1000), "snapshot": "",
            # the view stops claiming to be live after this long without an update
            "stale_after_ms": round(max(10.0, 5 * self.interval) * 1000),
            "facts": [f"{len(stats)} communicator{_plural(len(stats))} ({open_count} open)",
                      f"{len(snap.links)} link{_plural(len(snap.links))}, "
                      f"{format_byte_rate(total)}",
                      f"{waiting} waiting"],
            "empty": "" if stats else ("No communicator in this kernel yet: create one with "
                                       "netq.new(...) and this view lists it."),
            "map": self._map(figures),
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
            rows.append({
                "name": self.name(ident), "role": snapshot.purpose,
                "transport": snapshot.protocol.upper(),
                "address": format_address(snapshot.address),
                "state": word.replace(" ", "-"), "state_label": word,
                "uptime": format_duration(snapshot.uptime), "peers": len(snapshot.peers),
                "in_rate": format_byte_rate(snapshot.bytes_in_per_s),
                "in_msgs": f"{format_count(snapshot.messages_in_per_s)} msg/s",
                "out_rate": format_byte_rate(snapshot.bytes_out_per_s),
                "out_msgs": f"{format_count(snapshot.messages_out_per_s)} msg/s",
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
                "reason": self.named(stall.reason), "since": _clock(stall.started),
                "lasted": format_duration(stall.seconds)}

    def _stalls_view(self) -> dict[str, Any]:
        active = self.snapshot.active_stalls
        longest = sorted(active, key=lambda stall: stall.started)[:MAX_STALLS]
        return {"active": [self._stall_line(stall) for stall in longest],
                "active_more": max(0, len(active) - MAX_STALLS),
                "ended": [self._stall_line(stall) for stall in self.snapshot.recent_stalls]}

    def _map(self, figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures]
             ) -> dict[str, Any]:
        """Servers left, clients right, outside peers grey on the side opposite their end;
        at most MAP_NODES boxes a side (the busiest), the rest folded into one box. Every
        position is computed here, in a 640-unit-wide coordinate system the view scales."""
        snap = self.snapshot
        stats = snap.communicators
        traffic: dict[uuid.UUID, float] = collections.defaultdict(float)
        side: dict[uuid.UUID, str] = {}
        for ident, snapshot in stats.items():
            side[ident] = "left" if snapshot.purpose == "server" else "right"
            traffic[ident] += 0.0
        for link in snap.links:
            rate = figures[(link.a, link.b)].bytes_per_s
            for end, other in ((link.a, link.b), (link.b, link.a)):
                traffic[end] += rate
                if end not in side:
                    side[end] = "right" if stats[other].purpose == "server" else "left"
        width, box_w, box_h, gap = 640, 176, 30, 8
        columns: dict[str, list[uuid.UUID]] = {"left": [], "right": []}
        folded: dict[str, list[uuid.UUID]] = {"left": [], "right": []}
        for column in ("left", "right"):
            members = [ident for ident, where in side.items() if where == column]
            busiest = sorted(members, key=lambda i: (-traffic[i], self.name(i)))
            if len(busiest) > MAP_NODES:
                shown, folded[column] = busiest[:MAP_NODES - 1], busiest[MAP_NODES - 1:]
            else:
                shown = busiest
            columns[column] = sorted(shown, key=lambda i: (stats.get(i) is None, self.name(i)))
        rows = max(len(columns["left"]) + bool(folded["left"]),
                   len(columns["right"]) + bool(folded["right"]), 1)
        height = rows * (box_h + gap) + gap
        place: dict[object, tuple[float, float]] = {}
        nodes = []
        for column, x in (("left", 2.0), ("right", float(width - box_w - 2))):
            count = len(columns[column]) + bool(folded[column])
            top = (height - count * (box_h + gap) + gap) / 2
            for index, ident in enumerate(columns[column]):
                y = top + index * (box_h + gap)
                place[ident] = (x, y)
                known = stats.get(ident)
                word = communicator_state(known) if known else "other process"
                address = format_address(known.address) if known else "-"
                detail = ("not in this kernel" if known is None else
                          known.protocol.upper() + (f" {address}" if address != "-" else ""))
                nodes.append({"name": self.name(ident), "x": x, "y": round(y, 1),
                              "state": word.replace(" ", "-"),
                              "detail": f"{word} · {detail}" if known else word,
                              "outside": known is None})
            if folded[column]:
                y = top + len(columns[column]) * (box_h + gap)
                place[column] = (x, y)
                rate = sum(traffic[i] for i in folded[column])
                nodes.append({"name": f"+{len(folded[column])} more", "x": x,
                              "y": round(y, 1), "state": "more",
                              "detail": f"folded · {format_byte_rate(rate)}",
                              "outside": False})
        edges: dict[tuple[object, object], dict[str, Any]] = {}
        for link in snap.links:
            ends = [end if end in place else side.get(end, "left") for end in (link.a, link.b)]
            if ends[0] not in place or ends[1] not in place or ends[0] == ends[1]:
                continue
            figure = figures[(link.a, link.b)]
            key = (ends[0], ends[1])
            edge = edges.get(key)
            if edge is None:
                edge = edges[key] = {"rate": 0.0, "waiting": False, "connected": False,
                                     "links": 0, "names": (self.name(link.a),
                                                           self.name(link.b))}
            edge["rate"] += figure.bytes_per_s
            edge["waiting"] = edge["waiting"] or bool(link.blocked)
            edge["connected"] = edge["connected"] or link.state == "connected"
            edge["links"] += 1
        drawn = []
        for (first, second), edge in edges.items():
            (ax, ay), (bx, by) = place[first], place[second]
            x1, x2 = (ax + box_w, bx) if ax < bx else (ax, bx + box_w)
            rate = edge["rate"]
            tone = "waiting" if edge["waiting"] else "flowing" if edge["connected"] else "idle"
            label = format_byte_rate(rate)
            names = (f"{edge['links']} links" if edge["links"] > 1 else
                     f"{edge['names'][0]} ↔ {edge['names'][1]}")
            y1, y2 = ay + box_h / 2, by + box_h / 2
            # the label sits near the right-hand end, where lines fanning out of one box
            # have parted; an idle line carries none (its title still says 0 B/s)
            left_x, left_y, right_x, right_y = (x1, y1, x2, y2) if x1 < x2 else (x2, y2, x1, y1)
            drawn.append({"x1": round(x1, 1), "y1": round(y1, 1),
                          "x2": round(x2, 1), "y2": round(y2, 1),
                          "width": round(1.0 + min(6.0, math.log10(1 + rate / 1024)), 1),
                          "tone": tone, "label": label if rate > 0 else "",
                          "label_x": round(left_x + 0.72 * (right_x - left_x), 1),
                          "label_y": round(left_y + 0.72 * (right_y - left_y) - 3, 1),
                          "title": f"{names}: {label}" + ("; waiting" if edge["waiting"]
                                                          else "")})
        return {"width": width, "height": height, "box_w": box_w, "box_h": box_h,
                "nodes": nodes, "edges": drawn}

    # -- static forms and display ------------------------------------------------------------

    def static_html(self) -> str:
        """The dashboard as an HTML fragment without a script: the current figures, saying
        it is a snapshot and when it was taken (never a live badge)."""
        with self._lock:
            view = dict(self.widget.view)
            view.update(self._static_header(self.snapshot))
        return render_html(view)

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

    def __repr__(self) -> str:
        snap = self.snapshot
        lines = [f"netq dashboard ({self.view_state}): {len(snap.communicators)} "
                 f"communicators, {len(snap.links)} links, {len(snap.active_stalls)} waiting"]
        for ident, snapshot in snap.communicators.items():
            lines.append(f"  {self.name(ident)}: {snapshot.summary()}")
        lines.extend(f"  ! {self._stall_line(s)['link']}: {self.named(s.reason)}"
                     for s in snap.active_stalls)
        return "\n".join(lines)

    def static_bundle(self) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self.static_html()}

    def _display_(self) -> DashboardWidget:
        """marimo's display hook: the live widget (marimo draws anywidgets itself and relays
        trait changes made on the sampling thread through the comm the widget opened in the
        cell); the thread starts unless :meth:`stop` was called. Once the dashboard is not
        live, the same widget draws its static form."""
        if not self._stopped:
            self.start()
        return self.widget


def _forget_older(table: dict[Any, _History], oldest_tick: int) -> None:
    """Drop the histories last seen at or before ``oldest_tick`` (out of the window)."""
    for key in [key for key, entry in table.items() if entry.last_tick <= oldest_tick]:
        del table[key]


def _no_history(lines: int, formatter) -> dict[str, Any]:
    return {"series": [[] for _ in range(lines)], "max": formatter(0), "size": 2}


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _format_messages(value: float) -> str:
    return f"{format_count(value)} queued"


def _budget(used: int, budget: int) -> dict[str, Any]:
    """``1.5 MiB of 64.0 MiB`` and the fraction used (for a bar; ``high`` past 90 %)."""
    if budget <= 0:
        return {"text": format_bytes(used), "fraction": 0.0, "high": False}
    fraction = min(1.0, max(0.0, used / budget))
    return {"text": f"{format_bytes(used)} of {format_bytes(budget)}",
            "fraction": round(fraction, 4), "high": fraction > 0.9}


# ------------------------------------------------------------------- the static renderer


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
    """A view document (:meth:`Dashboard.view`) as HTML without a script, in the DOM the live
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


def dashboard(interval: float = DEFAULT_INTERVAL, **options) -> Dashboard:
    """A live view of every communicator in this kernel and the links between them.

    Display it (a cell's last expression, in Jupyter or marimo); ``.stop()`` ends its
    thread, ``.save(path)`` writes a static HTML snapshot. Options: see :class:`Dashboard`.
    """
    return Dashboard(interval, **options)
