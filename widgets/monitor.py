"""The live view of a communicator: a per-peer table and bokeh time series, in one widget.

``Monitor(communicator)`` (or ``communicator.monitor()``, or a communicator displayed as a
cell's last expression) builds an ``ipywidgets.VBox`` of

* :class:`PeerTable`: an ``ipywidgets.HTML`` with the header line and one row per peer
  (``netq.display``: the same fields as ``python -m netq demo``), and
* a :class:`DisplayOnlyBokehModel` showing :class:`PeerPlots` (throughput, queue depth and
  memory per peer),

and attaches it to the communicator's :class:`Sampler` when it is displayed in a kernel (or on
:meth:`Monitor.start`). The sampler thread updates it at ``1 / interval`` Hz while other cells
run, and stops when the communicator closes or the last monitor stops. Without a kernel the
same object shows a static text/HTML summary and starts no thread.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import ipywidgets

from ..display import (
    MiB,
    Series,
    format_byte_rate,
    format_bytes,
    format_count,
    html_table,
    peer_fields,
    peer_name,
    svg_chart,
    svg_charts,
    text_table,
)
from .plots import DisplayOnlyBokehModel, PeerPlots, load_bokeh
from .replaceable import ReplaceableView
from .sampler import DEFAULT_INTERVAL, Sampler

if TYPE_CHECKING:
    from ..statistics import CommunicatorStatistics

__all__ = ("Monitor", "PeerTable")


class PeerTable:
    """The header line and per-peer table as an ``ipywidgets.HTML`` (``root``)."""

    def __init__(self, names: Mapping[uuid.UUID, str] | None = None, *,
                 max_rows: int | None = 50) -> None:
        self.names = names
        self.max_rows = max_rows
        self.root = ipywidgets.HTML(value="", layout=ipywidgets.Layout(overflow="auto"))
        self.root.add_class("netq-monitor-table")
        self.stats: CommunicatorStatistics | None = None  # the snapshot shown

    @property
    def rows(self) -> list[dict[str, str]]:
        """What the table shows, as strings, one dict per peer (sorted by peer id)."""
        if self.stats is None:
            return []
        return [peer_fields(row, self.names)
                for row in sorted(self.stats.peers, key=lambda r: str(r.peer))]

    def update(self, stats: CommunicatorStatistics,
               colours: Mapping[uuid.UUID, str] | None = None,
               view_state: str | None = None) -> None:
        """Show ``stats``; ``colours``: the plotted peers' swatches; ``view_state``: the title's
        badge instead of ``open`` (``"stopped"``)."""
        self.stats = stats
        self.root.value = html_table(stats, self.names, self.max_rows, colours=colours,
                                     view_state=view_state)


class Monitor(ReplaceableView):
    """A live Jupyter view of one communicator's :meth:`~netq.Communicator.statistics`.

    ``interval``: seconds between samples (default 0.5: 2 Hz). ``names``: display names for
    peer ids (default: the first 8 hex digits). ``history``: points kept per line.
    ``max_rows`` / ``max_peers``: peers shown in the table / plotted. ``start``: attach to
    the sampler now (``True``), never by itself (``False``), or when displayed in a kernel
    (``None``, the default).
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
        self.plots = PeerPlots(names, history=history, max_peers=max_peers)
        self.bokeh = DisplayOnlyBokehModel(self.plots.root, combine_events=True)
        self.plots.resync = self.bokeh.resync
        self.plots.streamer = self.bokeh.stream
        self.widget = ipywidgets.VBox([self.table.root, self.bokeh])
        self.widget.add_class("netq-monitor")
        self._lock = threading.Lock()  # one update at a time (sampler vs. user thread)
        self._sampler: Sampler | None = None
        self._stopped = False  # stop() was called: displaying again does not restart
        self.update()
        if start:
            self.start()

    # -- control --------------------------------------------------------------------------

    def update(self, stats: CommunicatorStatistics | None = None) -> None:
        """Show one snapshot (default: a fresh ``statistics()``) in the table and plots."""
        if stats is None:
            stats = self.communicator.statistics()
        with self._lock:
            self.stats = stats
            self.plots.update(stats)
            self.table.update(stats, self.plots.colours(), self.view_state)

    def start(self) -> Monitor:
        """Attach to the communicator's sampler thread (idempotent)."""
        self._stopped = False
        if self.running:
            return self
        if self.communicator.statistics().state == "closed":
            self.update()
            return self
        self._sampler = Sampler.attach(self.communicator, self, self.interval)
        self.update()  # the badge leaves "stopped" now, not at the next tick
        self._show_live()
        return self

    def stop(self) -> None:
        """Stop updating; the sampler thread ends when no monitor of its communicator is left.

        The view says so: its badge reads ``stopped`` and, where it was displayed, the live
        widget is replaced by its static form (title, table and charts as of now).
        """
        self._stopped = True
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.detach(self)
        self.update()
        self._show_static()

    @property
    def view_state(self) -> str | None:
        """What the title's badge says instead of the communicator's ``open``: ``stopped``
        once :meth:`stop` was called (None while live)."""
        return "stopped" if self._stopped else None

    def close(self) -> None:
        """Stop and close the widgets (their views disappear from the notebook)."""
        self.stop()
        self.bokeh.close()
        self.table.root.close()
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
        self._sampler = None
        if stats is not None:
            self.update(stats)
        self._show_static()

    # -- static form ------------------------------------------------------------------------

    def charts_html(self) -> str:
        """The plotted history as inline SVG charts (what a static page shows)."""
        with self._lock:
            data = {key: list(values) for key, values in self.plots.source.data.items()}
            peers = dict(self.plots.peers)
            departed = set(self.plots.departed)
        times = data.get("t", [])
        if len(times) < 2 or not peers:
            return ""

        def lines(suffixes: tuple[str, ...]) -> list[Series]:
            found = []
            for peer, index in peers.items():
                name = peer_name(peer, self.names) + (" (left)" if peer in departed else "")
                colour = self.plots.colour(peer) or "#444"
                for suffix in suffixes:
                    dash = "4 3" if suffix.endswith("_out") else ""
                    found.append(Series(f"{name} {suffix}", colour, dash,
                                        data.get(f"p{index}_{suffix}", []),
                                        self.plots.line_width(index)))
            return found

        return svg_charts([
            svg_chart("throughput, dashed: out", times,
                      lines(("mb_in", "mb_out")), lambda v: format_byte_rate(v * MiB)),
            svg_chart("queued messages, dashed: out", times,
                      lines(("queue_in", "queue_out")),
                      lambda v: format_count(v) if v >= 10 else f"{v:g}"),
            svg_chart("memory held", times, lines(("memory",)),
                      lambda v: format_bytes(v * MiB)),
        ])

    def static_html(self) -> str:
        """Title row, table (with the plots' colours) and SVG charts: no script, no widget."""
        stats = self.stats
        return html_table(stats, self.names, self.table.max_rows, colours=self.plots.colours(),
                          view_state=self.view_state, footer=self.charts_html())

    def static_bundle(self) -> dict[str, str]:
        """``text/plain`` + ``text/html`` (:meth:`static_html`): nbconvert, a docs site and
        GitHub show this where no widget manager runs."""
        return {"text/plain": text_table(self.stats, self.names, self.table.max_rows),
                "text/html": self.static_html()}

    # -- display ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        stats = self.stats if self.running else self.communicator.statistics()
        return text_table(stats, self.names, self.table.max_rows)

    def _repr_html_(self) -> str:
        if not self.running:
            self.update()
        return self.static_html()

    def _live_bundle(self) -> dict:
        load_bokeh()
        with self._lock:  # the new view renders from the current document
            self.bokeh.refresh()
        bundle = self.widget._repr_mimebundle_() or {}
        bundle.update(self.static_bundle())  # our text, not the VBox's repr
        return bundle
