"""The live view of a communicator: title row, charts, legend and per-peer table, one widget.

``Monitor(communicator)`` (or ``communicator.monitor()``, or a communicator displayed as a
cell's last expression) builds a :class:`MonitorWidget`, an ``anywidget.AnyWidget`` whose ES
module and CSS (``widgets/frontend/monitor.js`` and ``monitor.css``) ship in the package: no
lab extension, no CDN. Python computes everything people read (``netq.display``: units,
ticks, names, order, the badge) and the browser draws it. The synced traits:

* ``view``: :func:`netq.display.view_model.monitor_view`, the title row, the table's busiest
  ``max_rows`` rows, one ``others`` row for the rest, the total, waits and footnotes;
* ``frame``: :func:`netq.display.charts.chart_frame`, the axes (ticks already labelled) and the
  plotted peers (at most ``max_peers``, the busiest) with their colours;
* ``point``: the newest sample of every plotted peer. The browser appends each one to the
  history it keeps (``history`` points); a view that starts later asks for the whole history
  once (a custom message ``{"type": "history"}``, answered with the :class:`PlotHistory`).

It attaches to the communicator's :class:`Sampler` when displayed (Jupyter or marimo) or on
:meth:`Monitor.start`; the sampler thread updates it at ``1 / interval`` Hz while other cells
run and stops when the communicator closes or the last monitor stops. Without a kernel the
same object shows a static text/HTML snapshot and starts no thread.
"""

from __future__ import annotations

import collections
import math
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import traitlets

from ..display.charts import CHARTS, PEER_COLOURS, SAMPLE, chart_frame, peer_sample
from ..display.static_form import monitor_html, monitor_text
from ..display.tables import peer_name
from ..display.view_model import FinalPicture, busiest_first, monitor_view
from .replaceable import LiveWidget, ReplaceableView
from .sampler import DEFAULT_INTERVAL, Sampler

if TYPE_CHECKING:
    from ..statistics import CommunicatorStatistics, PeerStatistics

__all__ = ("Monitor", "MonitorWidget", "PeerTable", "PlotHistory", "FRONTEND")

FRONTEND = Path(__file__).resolve().with_name("frontend")
# A plotted peer keeps its place (its colour and its past) until it has ranked outside the
# busiest ``max_peers`` for this many samples in a row: a busier peer then takes it. Without
# it, peers of similar traffic would swap lines at every sample.
HYSTERESIS = 4


class _Picture(NamedTuple):
    """One sample as the monitor showed it: what a frozen view keeps."""
    stats: CommunicatorStatistics
    taken_at: float  # time.time() of the sample
    colours: dict[uuid.UUID, str]
    frame: dict[str, Any]


def _connected(stats: CommunicatorStatistics) -> int:
    """A monitor's size for :class:`FinalPicture`: its peers not leaving."""
    return sum(1 for row in stats.peers if row.state not in ("closing", "closed"))


def _rounded(sample: list[float] | None) -> list[float] | None:
    """Four significant digits: what a chart of a few hundred pixels can show, in less JSON."""
    if sample is None:
        return None
    return [float(f"{value:.4g}") for value in sample]


class MonitorWidget(LiveWidget):
    """The browser side of a :class:`Monitor`; see the module docstring for its traits."""

    data_traits = ("view", "frame", "point")

    _esm = FRONTEND / "monitor.js"
    _css = FRONTEND / "monitor.css"
    view = traitlets.Dict().tag(sync=True)
    frame = traitlets.Dict().tag(sync=True)
    point = traitlets.Dict().tag(sync=True)


class PlotHistory:
    """The charts' data: the last ``history`` samples of at most ``max_peers`` plotted peers.

    The plotted peers are the busiest (:func:`netq.display.view_model.busiest_first`); a peer
    keeps its place, colour and past until it has ranked outside the busiest ``max_peers`` for
    ``HYSTERESIS`` samples and a busier one needs the place, or until it left (its lines
    end; it is dropped once its data has rolled out of the window or its place is needed).
    Only plotted peers have a history: memory and CPU are bounded by ``max_peers x history``.
    """

    def __init__(self, names: Mapping[uuid.UUID, str] | None = None, *, history: int = 600,
                 max_peers: int = 16) -> None:
        if history < 2:
            raise ValueError("history must be at least 2 points")
        self.names = names
        self.history = history
        self.max_peers = max_peers
        self.times: collections.deque[float] = collections.deque(maxlen=history)
        # plotted peer -> its samples, aligned with `times` (None: the peer was not there)
        self.samples: dict[uuid.UUID, collections.deque[list[float] | None]] = {}
        self._colour: dict[uuid.UUID, int] = {}  # plotted peer -> index into PEER_COLOURS
        self.departed: dict[uuid.UUID, int] = {}  # plotted peer that left -> samples since
        # Peer dropped from the plot -> (the time of its last sample, its samples by time),
        # while in the window: a frozen picture taken before (a monitor whose communicator
        # closed, its plotted peers among the first to leave) still draws their lines
        # (window()). At most max_peers of them.
        self._dropped: dict[uuid.UUID, tuple[float, dict[float, list[float] | None]]] = {}
        self._outside: dict[uuid.UUID, int] = {}  # plotted peer -> samples outside the top
        # per chart: the highest value of any plotted line at each sample (the y axis' range)
        self._highest: dict[str, collections.deque[float]] = {
            chart.metric: collections.deque(maxlen=history) for chart in CHARTS}
        self.changes = 0  # how often the plotted set changed

    @property
    def peers(self) -> list[uuid.UUID]:
        """The plotted peers, in legend order."""
        return list(self.samples)

    def update(self, stats: CommunicatorStatistics,
               ordered: list[PeerStatistics] | None = None) -> None:
        """Add one sample (``ordered``: ``stats.peers`` busiest first, if already sorted)."""
        if ordered is None:
            ordered = busiest_first(stats.peers, self.names)
        present = {row.peer: row for row in ordered}
        rank = {row.peer: index for index, row in enumerate(ordered)}
        for peer in list(self.samples):
            if peer in present:
                self.departed.pop(peer, None)
            else:
                self.departed[peer] = self.departed.get(peer, -1) + 1
                if self.departed[peer] >= self.history:
                    self._drop(peer)
        for peer in self.samples:
            outside = rank.get(peer, math.inf) >= self.max_peers
            self._outside[peer] = self._outside.get(peer, 0) + 1 if outside else 0
        for row in ordered[:self.max_peers]:
            if row.peer in self.samples:
                continue
            if len(self.samples) >= self.max_peers:
                victim = self._evictable(rank)
                if victim is None:
                    break
                self._drop(victim)
            self._add(row.peer)
        self.times.append(stats.uptime)
        if self._dropped:
            oldest = self.times[0]
            for gone in [gone for gone, (last, _) in self._dropped.items() if last < oldest]:
                del self._dropped[gone]  # rolled out of the window
        for peer, samples in self.samples.items():
            now = present.get(peer)
            samples.append(peer_sample(now) if now is not None else None)
        for chart in CHARTS:
            self._highest[chart.metric].append(self._highest_now(chart.lines, -1))

    def _evictable(self, rank: Mapping[uuid.UUID, int]) -> uuid.UUID | None:
        if self.departed:
            return max(self.departed, key=lambda peer: self.departed[peer])
        waiting = [peer for peer in self.samples if self._outside.get(peer, 0) >= HYSTERESIS]
        return max(waiting, key=lambda peer: rank.get(peer, math.inf)) if waiting else None

    def _add(self, peer: uuid.UUID) -> None:
        self._dropped.pop(peer, None)
        used = set(self._colour.values())
        self._colour[peer] = next((i for i in range(len(PEER_COLOURS)) if i not in used),
                                  len(self._colour) % len(PEER_COLOURS))
        self.samples[peer] = collections.deque([None] * len(self.times), maxlen=self.history)
        self._outside[peer] = 0
        self.changes += 1

    def _drop(self, peer: uuid.UUID) -> None:
        dropped = self._dropped
        if self.times:
            if len(dropped) >= self.max_peers:
                del dropped[next(iter(dropped))]
            dropped[peer] = (self.times[-1],
                             dict(zip(self.times, self.samples[peer], strict=False)))
        del self.samples[peer]
        self._colour.pop(peer, None)
        self.departed.pop(peer, None)
        self._outside.pop(peer, None)
        self.changes += 1
        for chart in CHARTS:  # the range without that peer's lines
            self._highest[chart.metric] = collections.deque(
                (self._highest_now(chart.lines, at) for at in range(len(self.times))),
                maxlen=self.history)

    def _highest_now(self, lines: tuple[tuple[int, str], ...], at: int) -> float:
        highest = 0.0
        for samples in self.samples.values():
            sample = samples[at] if samples else None
            if sample is not None:
                for index, _ in lines:
                    highest = max(highest, sample[index])
        return highest

    # -- what the browser gets -------------------------------------------------------------

    def colours(self) -> dict[uuid.UUID, str]:
        """Each plotted peer's colour (lines, legend swatch, table swatch)."""
        return {peer: PEER_COLOURS[index] for peer, index in self._colour.items()}

    def legend(self) -> list[dict[str, Any]]:
        """The plotted peers in legend order: ``key`` (the id), ``peer`` (the display name),
        ``label`` (``"(left)"`` once it left), ``colour`` and line ``width`` (earlier peers
        wider and drawn below, so identical lines each stay visible as a coloured edge)."""
        count = len(self.samples)
        entries = []
        for number, peer in enumerate(self.samples):
            name = peer_name(peer, self.names)
            width = 1.4 + 1.6 * (count - 1 - number) / max(count - 1, 1)
            entries.append({"key": str(peer), "peer": name,
                            "label": f"{name} (left)" if peer in self.departed else name,
                            "colour": PEER_COLOURS[self._colour[peer]],
                            "width": round(width, 2)})
        return entries

    def frame(self) -> dict[str, Any]:
        """:func:`netq.display.charts.chart_frame` of the current window."""
        highest = {metric: max(values, default=0.0) for metric, values in self._highest.items()}
        return chart_frame(list(self.times), self.legend(), highest, self.history)

    def point(self) -> dict[str, Any]:
        """The newest sample: ``{"t": uptime, "values": {peer id: [5 values] or None}}``."""
        if not self.times:
            return {}
        return {"t": self.times[-1],
                "values": {str(peer): _rounded(samples[-1])
                           for peer, samples in self.samples.items()}}

    def series_json(self) -> dict[str, list]:
        """Every plotted peer's samples (rounded), keyed by its id, aligned with ``times``."""
        return {str(peer): [_rounded(sample) for sample in samples]
                for peer, samples in self.samples.items()}

    def window(self, until: float) -> tuple[list[float], dict[str, list]]:
        """``times`` and :meth:`series_json` cut after the sample taken at uptime ``until``
        (what the charts showed then: a frozen view's picture), with the lines of peers
        dropped from the plot since, while they are in the window."""
        count = sum(1 for t in self.times if t <= until)
        times = list(self.times)[:count]
        series = {key: samples[:count] for key, samples in self.series_json().items()}
        for peer, (_, by_time) in self._dropped.items():
            series.setdefault(str(peer), [_rounded(by_time.get(t)) for t in times])
        return times, series

    def history_message(self) -> dict[str, Any]:
        """The answer to a view's ``{"type": "history"}``: the whole window."""
        return {"type": "history", "t": list(self.times), "series": self.series_json()}

    def series(self, peer: uuid.UUID, metric: str) -> list[float]:
        """One plotted peer's values of ``metric`` (a name in :data:`netq.display.charts.SAMPLE`),
        NaN where it was absent."""
        index = SAMPLE.index(metric)
        return [math.nan if sample is None else sample[index] for sample in self.samples[peer]]


class PeerTable:
    """What the table shows: the last ``view`` (:func:`netq.display.view_model.monitor_view`)."""

    def __init__(self, names: Mapping[uuid.UUID, str] | None = None, *,
                 max_rows: int | None = 50) -> None:
        self.names = names
        self.max_rows = max_rows
        self.view: dict[str, Any] = {}

    @property
    def rows(self) -> list[dict[str, str]]:
        """The peer rows shown, busiest first, as ``{column key: text}`` (``peer``: the display
        name); the ``others`` and total rows are not in it."""
        if not self.view:
            return []
        keys = [key for key, _, _ in self.view["columns"]]
        return [dict(zip(keys, row["cells"], strict=True)) for row in self.view["rows"]]


class Monitor(ReplaceableView):
    """A live Jupyter or marimo view of one communicator's
    :meth:`~netq.Communicator.statistics`.

    ``interval``: seconds between samples (default 0.5: 2 Hz). ``names``: display names for
    peer ids (default: the first 8 hex digits; read at every sample, so it may be filled in
    later). ``history``: points kept per line. ``max_rows``: peer rows in the table (the
    busiest; the rest are one ``others`` row). ``max_peers``: peers plotted (the busiest).
    ``start``: attach to the sampler now (``True``), never by itself (``False``), or when
    displayed (``None``, the default).
    """

    stats: CommunicatorStatistics  # the last snapshot shown (update() sets it in __init__)

    def __init__(self, communicator, interval: float = DEFAULT_INTERVAL, *,
                 names: Mapping[uuid.UUID, str] | None = None, history: int = 600,
                 max_rows: int | None = 50, max_peers: int = 16,
                 start: bool | None = None) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive (seconds)")
        self.communicator = communicator
        self.interval = interval
        self.names = names
        self.table = PeerTable(names, max_rows=max_rows)
        self.plots = PlotHistory(names, history=history, max_peers=max_peers)
        self.widget = MonitorWidget()
        # ipywidgets keeps every open widget in a process-wide registry: a callback that held
        # this monitor would keep it, and its communicator, alive for good.
        on_message = weakref.WeakMethod(self._on_message)

        def relay(widget, content, buffers) -> None:
            handler = on_message()
            if handler is not None:
                handler(widget, content, buffers)

        self.widget.on_msg(relay)
        self.taken_at = time.time()  # wall-clock time of the snapshot shown
        self.history_requests = 0  # views that asked for the whole history
        self._lock = threading.Lock()  # one update at a time (sampler vs. user thread)
        self._sampler: Sampler | None = None
        self._stopped = False  # stop() was called: displaying again does not restart
        # The last live pictures, for the one a view keeps when its communicator closes.
        self._final: FinalPicture[_Picture] = FinalPicture()
        # Once frozen: the badge word and the static bundle, computed once from one sample.
        self._frozen_state: str | None = None
        self._frozen_bundle: dict[str, str] = {}
        self.update()
        if start:
            self.start()

    # -- control --------------------------------------------------------------------------

    def update(self, stats: CommunicatorStatistics | None = None) -> None:
        """Show one snapshot (default: a fresh ``statistics()``): one more point in the charts,
        the table and title as of now, sent to the browser in one message. Does nothing once
        the view is frozen (``freeze()``, ``stop()``, its communicator closed) until
        :meth:`start`. The first closed snapshot freezes the view on its last live picture."""
        if self._frozen_state is not None:
            return
        if stats is None:
            stats = self.communicator.statistics()
        with self._lock:
            if self._frozen_state is not None:
                return
            if stats.state == "closed":
                self._freeze_locked("closed", closed=stats)
            else:
                self._show_sample(stats)
        if self._frozen_state is not None:
            self._end_sampling()
            self._show_static()

    def _show_sample(self, stats: CommunicatorStatistics) -> None:
        self.stats = stats
        self.taken_at = time.time()
        ordered = busiest_first(stats.peers, self.names)
        self.plots.update(stats, ordered)
        colours = self.plots.colours()
        view = monitor_view(stats, self.names, max_rows=self.table.max_rows,
                            live=self.running, colours=colours, taken_at=self.taken_at,
                            ordered=ordered)
        # A live view that hears nothing for this long says it is a snapshot (monitor.js).
        view["stale_after_ms"] = round(max(10.0, 5 * self.interval) * 1000)
        self.table.view = view
        frame = self.plots.frame()
        self._final.add(_Picture(stats, self.taken_at, colours, frame), _connected(stats))
        with self.widget.hold_sync():
            self.widget.view = view
            self.widget.frame = frame
            self.widget.point = self.plots.point()

    def _freeze_locked(self, state: str,
                       closed: CommunicatorStatistics | None = None) -> None:
        """Keep one picture for good: the newest, or (``closed``: the communicator's closed
        snapshot) the last live one before its closing began. Holds ``self._lock``."""
        self._stopped = True
        picture = self._final.final() if closed is not None else None
        if picture is None:
            stats = closed if closed is not None else self.stats
            picture = _Picture(stats, self.taken_at if closed is None else time.time(),
                               self.plots.colours(), self.plots.frame())
        reason = {"snapshot": "frozen", "stopped": "the view was stopped"}.get(state)
        if closed is not None and picture.stats is not closed:
            reason = "the communicator closed after it"
        view = monitor_view(picture.stats, self.names, max_rows=self.table.max_rows,
                            live=False, view_state=state, colours=picture.colours,
                            taken_at=picture.taken_at, snapshot_reason=reason)
        times, series = self.plots.window(picture.stats.uptime)
        self.stats, self.taken_at, self.table.view = picture.stats, picture.taken_at, view
        self._keep(state, {"text/plain": monitor_text(view),
                           "text/html": monitor_html(view, picture.frame, times, series)})
        with self.widget.hold_sync():
            self.widget.view = view
            self.widget.frame = picture.frame

    def _on_message(self, widget, content, buffers) -> None:
        """A view asks for the whole history (it started after the first samples)."""
        if isinstance(content, dict) and content.get("type") == "history":
            with self._lock:  # sent before any later point: the browser's order is the kernel's
                self.history_requests += 1
                self.widget.send(self.plots.history_message())

    def start(self) -> Monitor:
        """Attach to the communicator's sampler thread (idempotent); a frozen view is live
        again (unless its communicator is closed: then it keeps its picture)."""
        if self.running:
            return self
        if self.communicator.statistics().state == "closed":
            self.update()
            return self
        self._thaw()
        self._sampler = Sampler.attach(self.communicator, self, self.interval)
        self.update()  # the badge says it is live now, not at the next tick
        self._show_live()
        return self

    def _end_sampling(self) -> None:
        """Leave the communicator's sampler; its thread ends when no monitor of the
        communicator is left (stopping a monitor leaves the communicator alone)."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.detach(self)

    @property
    def view_state(self) -> str | None:
        """The static form's badge once frozen: ``snapshot`` (``freeze()``), ``stopped``
        (``stop()``) or ``closed``; None while the view may still update."""
        return self._frozen_state

    def close(self) -> None:
        """Stop and close the widget (its views disappear)."""
        self.stop()
        self.widget.close()

    @property
    def running(self) -> bool:
        sampler = self._sampler
        return sampler is not None and sampler.alive and self in sampler.views

    @property
    def sampler(self) -> Sampler | None:
        return self._sampler

    # -- sampler callbacks (sampler thread) -------------------------------------------------

    def _sample(self, stats) -> None:
        self.update(stats)

    def _sampler_stopped(self, stats) -> None:
        """The sampler ended: on the communicator's closing (the view then keeps its last
        live picture, see :meth:`update`) or without it (marimo's cell gone, an error)."""
        self._sampler = None
        if stats is not None:
            self.update(stats)
        with self._lock:
            if self._frozen_state is None:
                self._freeze_locked("stopped")
        self._show_static()

    # -- static form ------------------------------------------------------------------------

    def _current_bundle(self) -> dict[str, str]:
        view = monitor_view(self.stats, self.names, max_rows=self.table.max_rows, live=False,
                            colours=self.plots.colours(), taken_at=self.taken_at)
        return {"text/plain": monitor_text(view),
                "text/html": monitor_html(view, self.plots.frame(), list(self.plots.times),
                                          self.plots.series_json())}

    # -- display ----------------------------------------------------------------------------

    def _repr_html_(self) -> str:
        if not self.running:
            self.update()
        return self.static_html()

    def _display_(self) -> MonitorWidget:
        """marimo's display hook (asked before ``_repr_*``): start sampling unless stopped, and
        show the anywidget, which marimo renders live (``mo.ui.anywidget``)."""
        if not self._stopped:
            self.start()
        elif not self.running:
            self.update()
        return self.widget
