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
figure already formatted by :mod:`netq.display`). One thread (``netq-dashboard``, the views'
sampling loop :class:`~netq.widgets.sampler.SamplingThread`) samples every communicator's
``statistics()`` and sets it. It ends when no communicator has been open for ``idle_stop``
seconds, at once when every communicator it saw has closed, or on ``freeze()`` /
``stop()``; the view then keeps one picture (once all closed: the last one before they
began closing, links included) and says it is a snapshot (``data-live="0"``).
``static_html()`` draws the same document without a script (the saved page, the
``text/html`` form beside the widget, and what replaces the widget in a notebook's output once
the dashboard is frozen), ``repr()`` as text.

What a tick sees (links, figures, histories, the map's geometry) is
:mod:`netq.widgets.dashboard_model`; the log of waits, the names and the document are
:mod:`netq.widgets.dashboard_view`; the static forms are drawn by
:mod:`netq.widgets.dashboard_html`.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import traitlets

from ..display.view_model import FinalPicture
from ..live import live_communicators
from ..statistics import CommunicatorStatistics
from .dashboard_html import FRONTEND, render_html, render_text
from .dashboard_model import (
    HISTORY,
    MAP_NODES,
    DashboardSnapshot,
    Link,
    LinkFigures,
    Stall,
)
from .dashboard_view import MAX_COMMUNICATORS, MAX_LINKS, MAX_STALLS, DashboardModel
from .replaceable import LiveWidget, ReplaceableView
from .sampler import SamplingThread

__all__ = ("Dashboard", "DashboardWidget", "dashboard", "Link", "Stall", "DashboardSnapshot",
           "DashboardModel", "HISTORY", "MAX_LINKS", "MAX_COMMUNICATORS", "MAP_NODES",
           "MAX_STALLS")

DEFAULT_INTERVAL = 1.0  # seconds


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
        self.idle_stop = idle_stop
        self.model = DashboardModel(names if names is not None else {}, interval,
                                    history=history, stall_log=stall_log, max_links=max_links,
                                    max_communicators=max_communicators)
        self._lock = threading.RLock()
        self._sampling: _DashboardSampling | None = None
        self._stopped = False
        self.ticks = 0  # samples taken by the sampling threads
        self.errors: collections.deque[BaseException] = collections.deque(maxlen=20)
        self.widget = DashboardWidget()
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
        return self.model.observe(stats, time.time())

    def update(self) -> None:
        """Sample and show (what the thread does each tick); nothing once frozen."""
        with self._lock:
            if self._frozen_state is not None:
                return
            self.snapshot = self.sample()
            figures = self.model.record(self.snapshot)
            view = self.view(figures, live=self.running)
            self.widget.view = view
            if _open_count(self.snapshot):
                self._final.add((self.snapshot, view), _final_size(self.snapshot))

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
        if self._sampling is not None:
            self._sampling.stop()

    def start(self) -> Dashboard:
        """Start the sampling thread (idempotent); a frozen view is live again."""
        if self.running:
            self._stopped = False
            return self
        self._thaw()
        self._sampling = _DashboardSampling(self)
        self._sampling.start()
        self.update()  # the view says live from now on
        self._show_live()
        return self

    @property
    def running(self) -> bool:
        return self._sampling is not None and self._sampling.alive

    @property
    def view_state(self) -> str:
        """What the badge of the view says now (``open``, ``waiting``, ..., ``snapshot``,
        ``stopped``, ``closed``; see :meth:`view`)."""
        return self._frozen_state or self.model.badge(self.snapshot, live=self.running,
                                                      stopped=self._ended())

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the (last) sampling thread, in seconds (time.thread_time)."""
        return self._sampling.cpu_seconds if self._sampling is not None else 0.0

    def cpu_fraction(self) -> float:
        """CPU time of the sampling thread / its wall-clock lifetime (1.0 = one core)."""
        return self._sampling.cpu_fraction() if self._sampling is not None else 0.0

    def cpu_per_tick(self) -> float:
        """Seconds of CPU the sampling thread spent per sample (0 before the first)."""
        ticks = self._sampling.ticks if self._sampling is not None else 0
        return self.cpu_seconds / ticks if ticks else 0.0

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

    # -- what the view shows (netq.widgets.dashboard_view) ---------------------------------

    @property
    def snapshot(self) -> DashboardSnapshot:
        """What the view shows: the last sample (once frozen, the one kept)."""
        return self.model.snapshot

    @snapshot.setter
    def snapshot(self, snapshot: DashboardSnapshot) -> None:
        self.model.snapshot = snapshot

    @property
    def names(self) -> Mapping[uuid.UUID, str]:
        return self.model.names

    def name(self, ident: uuid.UUID) -> str:
        """A communicator's (or outside peer's) display name
        (:meth:`~netq.widgets.dashboard_view.DashboardModel.name`)."""
        return self.model.name(ident)

    def named(self, text: str) -> str:
        """``text`` with every id in it written as its display name."""
        return self.model.named(text)

    def link_history(self, a: uuid.UUID, b: uuid.UUID) -> list[tuple[float, ...] | None]:
        """The samples kept for the link from ``a`` to ``b``
        (:meth:`~netq.widgets.dashboard_view.DashboardModel.link_history`)."""
        with self._lock:
            return self.model.link_history(a, b)

    @property
    def tracked_links(self) -> int:
        """How many links have a history kept (those seen within the history window)."""
        return self.model.tracked_links

    def view(self, figures: Mapping[tuple[uuid.UUID, uuid.UUID], LinkFigures] | None = None,
             *, live: bool = False) -> dict[str, Any]:
        """The JSON document the live view draws
        (:meth:`~netq.widgets.dashboard_view.DashboardModel.view`)."""
        return self.model.view(figures, live=live, frozen=self._frozen_state,
                               stopped=self._ended())

    def _ended(self) -> bool:
        """Stopped, or its thread ended: a static form then says ``stopped``."""
        return self._stopped or (self._sampling is not None and not self.running)

    def _static_header(self, snapshot: DashboardSnapshot, state: str | None = None,
                       reason: str | None = None) -> dict[str, Any]:
        return self.model.static_header(snapshot, state or self.model.badge(
            snapshot, live=False, frozen=self._frozen_state, stopped=self._ended()), reason)

    # -- static forms and display ------------------------------------------------------------

    @property
    def html(self) -> str:
        """``static_html()``: what a page without a widget manager shows."""
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


class _DashboardSampling(SamplingThread):
    """The dashboard's thread (``netq-dashboard``): :meth:`Dashboard.update` each tick; it
    ends once every communicator it saw open has closed, or after ``idle_stop`` seconds
    without any open, and the dashboard freezes (:meth:`Dashboard._finish`)."""

    def __init__(self, board: Dashboard) -> None:
        super().__init__("netq-dashboard", board.interval, board.errors)
        self.board = board
        self.idle_since: float | None = None
        self.seen_open = False

    def _tick(self) -> bool:
        board = self.board
        try:
            board.update()
        except Exception as error:  # noqa: BLE001 - never print from a thread
            self._record(error)
        board.ticks += 1
        if _open_count(board.snapshot):
            self.seen_open, self.idle_since = True, None
            return True
        now = time.monotonic()
        self.idle_since = self.idle_since if self.idle_since is not None else now
        return not (self.seen_open or now - self.idle_since >= board.idle_stop)

    def _finished(self) -> None:
        self.board._finish()


def _open_count(snapshot: DashboardSnapshot) -> int:
    """Communicators not closed."""
    return sum(1 for stats in snapshot.communicators.values() if stats.state != "closed")


def _final_size(snapshot: DashboardSnapshot) -> int:
    """The dashboard's size for :class:`FinalPicture`: communicators neither closing nor
    closed, and the links between them. A closing client's link may be gone from a sample
    that still shows the client open: that sample is then part of the decline, not the
    picture kept."""
    return len(snapshot.links) + sum(1 for stats in snapshot.communicators.values()
                                     if stats.state not in ("closing", "closed"))


def dashboard(interval: float = DEFAULT_INTERVAL, **options) -> Dashboard:
    """A live view of every communicator in this kernel and the links between them.

    Display it (a cell's last expression, in Jupyter or marimo); ``.stop()`` ends its
    thread, ``.save(path)`` writes a static HTML snapshot. Options: see :class:`Dashboard`.
    """
    return Dashboard(interval, **options)
