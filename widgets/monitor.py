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

from ..display import html_table, in_kernel, peer_fields, static_bundle, text_table
from .plots import DisplayOnlyBokehModel, PeerPlots, load_bokeh
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

    def update(self, stats: CommunicatorStatistics) -> None:
        self.stats = stats
        self.root.value = html_table(stats, self.names, self.max_rows)


class Monitor:
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
            self.table.update(stats)
            self.plots.update(stats)

    def start(self) -> Monitor:
        """Attach to the communicator's sampler thread (idempotent)."""
        self._stopped = False
        if self.running:
            return self
        if self.communicator.statistics().state == "closed":
            self.update()
            return self
        self._sampler = Sampler.attach(self.communicator, self, self.interval)
        return self

    def stop(self) -> None:
        """Stop updating; the sampler thread ends when no monitor of its communicator is left."""
        self._stopped = True
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.detach(self)

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

    # -- display ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        stats = self.stats if self.running else self.communicator.statistics()
        return text_table(stats, self.names, self.table.max_rows)

    def _repr_html_(self) -> str:
        stats = self.stats if self.running else self.communicator.statistics()
        return html_table(stats, self.names, self.table.max_rows)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """In a kernel: the live widget (plus static fallbacks); elsewhere: static only."""
        if not self.running:
            self.update()
        bundle = static_bundle(self.stats, self.names, self.table.max_rows)
        if in_kernel():
            load_bokeh()
            with self._lock:  # the new view renders from the current document
                self.bokeh.refresh()
            if not self._stopped:
                self.start()
            bundle.update(self.widget._repr_mimebundle_() or {})
            bundle["text/plain"] = text_table(self.stats, self.names, self.table.max_rows)
        return bundle
