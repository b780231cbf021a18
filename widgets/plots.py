"""Bokeh time series of the per-peer figures, and the display-only ``BokehModel``.

:class:`PeerPlots` is testable without a browser (like dask's dashboard components): it has a
``source`` (one ``ColumnDataSource``), a ``root`` (the bokeh layout) and ``update(stats)``.

The source is *wide*: column ``t`` (the communicator's uptime, seconds) plus, for each plotted
peer ``i``, ``p<i>_mb_in``, ``p<i>_mb_out`` (MiB/s), ``p<i>_queue_in``, ``p<i>_queue_out``
(messages) and ``p<i>_memory`` (MiB). The axes label their ticks in auto-scaled binary units
(``512 KiB/s``, ``1.5 MiB``), the unit convention of the whole display. One ``stream()`` per
tick then carries every peer in one patch message, whatever the number of peers. A peer that
joins adds its columns (filled with NaN for the past) and its lines; a peer that leaves gets
NaN from then on (its lines end and its legend entry says "left"), and its columns are dropped
once its data has rolled out of the window. At most ``max_peers`` peers are plotted at a time
(the table shows them all).
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from bokeh.core.serialization import make_id
from bokeh.layouts import column, row
from bokeh.models import (
    AdaptiveTicker,
    ColumnDataSource,
    CustomJS,
    CustomJSTickFormatter,
    DataRange1d,
    Range1d,
    TapTool,
)
from bokeh.models.annotations import Title  # bokeh.models' star import hides it
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

from ..display import PALETTE, MiB, peer_name, peer_values

if TYPE_CHECKING:
    from bokeh.models.renderers import GlyphRenderer

__all__ = ("PeerPlots", "DisplayOnlyBokehModel", "load_bokeh", "METRICS")

NAN = math.nan
# column suffix -> (figure, line dash, how to get it from peer_values())
METRICS = {
    "mb_in": ("throughput", "solid", lambda v: v["mb_in"]),
    "mb_out": ("throughput", "dashed", lambda v: v["mb_out"]),
    "queue_in": ("queue", "solid", lambda v: float(v["queue_in"])),
    "queue_out": ("queue", "dashed", lambda v: float(v["queue_out"])),
    "memory": ("memory", "solid", lambda v: v["memory"] / MiB),
}
FIGURES = {  # titles short enough for a third of the table's width
    "throughput": "throughput, dashed: out",
    "queue": "queued messages, dashed: out",
    "memory": "memory held",
}
# Tick labels in binary units, scaled to the tick (the plotted values are MiB or MiB/s).
_BINARY_TICKS = """
const units = ["B", "KiB", "MiB", "GiB", "TiB"];
let value = tick * 1048576, unit = 0;
while (Math.abs(value) >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
const text = value === 0 ? "0" : (Math.abs(value) < 10 ? value.toFixed(1) : value.toFixed(0));
return value === 0 ? "0" : text + " " + units[unit] + SUFFIX;
"""
TICK_FORMATTERS = {"throughput": "/s", "memory": ""}
# The legend strip, in pixels (its x range is its width): height, swatch width, gap between
# swatch and label, gap between entries, and a 9pt label's average character width.
LEGEND_HEIGHT, SWATCH, SWATCH_GAP, ENTRY_GAP, CHAR_WIDTH = 26, 18, 6, 20, 6.5
# A tap on a legend entry: hide or show that peer's lines, dim its entry while hidden.
# (The entry is found by the tap's x, in pixels: no selection, so no tap mode to get in the way.)
_TOGGLE_LINES = """
const x = cb_data.geometries.x;
const left = source.get_column("left"), right = source.get_column("right");
let i = -1;
for (let k = 0; k < left.length; k++) if (left[k] <= x && x <= right[k]) i = k;
if (i < 0 || lines[i] == null) return;
const visible = !lines[i][0].visible;
for (const line of lines[i]) line.visible = visible;
source.patch({alpha: [[i, visible ? 1.0 : 0.3]]});
"""


def _legend_columns(entries: list[tuple[str, str]]) -> dict[str, list[Any]]:
    """The legend strip's columns for (label, colour) entries laid out from the left."""
    columns: dict[str, list[Any]] = {key: [] for key in (
        "left", "swatch_right", "text_x", "right", "label", "colour", "alpha")}
    x = 4.0
    for label, colour in entries:
        right = x + SWATCH + SWATCH_GAP + CHAR_WIDTH * len(label)
        for key, item in (("left", x), ("swatch_right", x + SWATCH),
                          ("text_x", x + SWATCH + SWATCH_GAP), ("right", right),
                          ("label", label), ("colour", colour), ("alpha", 1.0)):
            columns[key].append(item)
        x = right + ENTRY_GAP
    return columns


class PeerPlots:
    """Three bokeh figures (throughput, queue depth, memory) with one line per peer."""

    def __init__(self, names: Mapping[uuid.UUID, str] | None = None, *, history: int = 600,
                 max_peers: int = 16, width: int = 780, height: int = 170) -> None:
        self.names = names
        self.history = history  # points kept per line (rollover)
        self.max_peers = max_peers
        self.source = ColumnDataSource(data={"t": []})
        self.figures = {}
        # Three small figures side by side, as wide together as the table above them.
        for key, title in FIGURES.items():
            fig = figure(title=title, width=width // len(FIGURES), height=height,
                         x_axis_label="uptime (s)", tools="pan,wheel_zoom,box_zoom,reset,save",
                         toolbar_location="right", name=f"netq-{key}",
                         y_range=DataRange1d(start=0), min_border_left=10)
            fig.toolbar.autohide = True
            if isinstance(fig.title, Title):
                fig.title.text_font_size = "9pt"
            fig.axis.major_label_text_font_size = "8pt"
            fig.xaxis.axis_label_text_font_size = "8pt"
            if key in TICK_FORMATTERS:
                # ticks at multiples of a power of two (0, 4, 8, 12 KiB), labelled in units
                fig.yaxis.ticker = AdaptiveTicker(base=2, mantissas=[1], min_interval=2**-20,
                                                  num_minor_ticks=0)
                fig.yaxis.formatter = CustomJSTickFormatter(
                    code=_BINARY_TICKS.replace("SUFFIX", repr(TICK_FORMATTERS[key])))
            self.figures[key] = fig
        x_range = self.figures["throughput"].x_range
        for fig in self.figures.values():
            fig.x_range = x_range
        # One legend for all three figures, in a strip of its own above them. Its swatches and
        # labels are ordinary glyphs (a Legend draws its swatches from the renderers of its
        # own figure, which JupyterLab's views left blank); a tap on an entry hides or shows
        # that peer's lines in all three figures.
        self.legend_strip = figure(width=width, height=LEGEND_HEIGHT, toolbar_location=None,
                                   name="netq-legend", outline_line_color=None,
                                   min_border=0, x_range=Range1d(start=0, end=width),
                                   y_range=Range1d(start=0, end=1), tools="")
        self.legend_strip.axis.visible = False
        self.legend_strip.grid.visible = False
        self.legend_source = ColumnDataSource(data=_legend_columns([]))
        hit: GlyphRenderer[Any] = self.legend_strip.quad(
            left="left", right="right", bottom=0, top=1, source=self.legend_source,
            fill_alpha=0, line_alpha=0, name="netq-legend-hit")
        self.legend_strip.quad(
            left="left", right="swatch_right", bottom=0.38, top=0.62, source=self.legend_source,
            fill_color="colour", line_color=None, fill_alpha="alpha", name="netq-legend-swatch")
        self.legend_strip.text(
            x="text_x", y=0.5, text="label", source=self.legend_source, text_font_size="9pt",
            text_baseline="middle", text_alpha="alpha", text_color="#333",
            name="netq-legend-label")
        self.legend_toggle = CustomJS(args={"source": self.legend_source, "lines": []},
                                      code=_TOGGLE_LINES)
        self.legend_strip.add_tools(TapTool(renderers=[hit], behavior="inspect",
                                            callback=self.legend_toggle))
        self.root = column(self.legend_strip, row(*self.figures.values()), name="netq-plots")
        self.peers: dict[uuid.UUID, int] = {}  # plotted peer -> its column index i
        self.departed: dict[uuid.UUID, int] = {}  # plotted peer that left -> tick it left
        self._renderers: dict[uuid.UUID, list[GlyphRenderer[Any]]] = {}
        self._legend_labels: dict[uuid.UUID, str] = {}  # in legend order
        self._next_index = 0
        self.ticks = 0
        # Context manager around structure changes; the Monitor sets it to its
        # DisplayOnlyBokehModel.resync so that they reach the browser as a new document.
        self.resync: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
        # How a tick's point is appended: bokeh's own stream() by default; the Monitor uses
        # DisplayOnlyBokehModel.stream (same message to the browser, much cheaper).
        self.streamer = lambda source, data, rollover: source.stream(data, rollover=rollover)

    # -- updates --------------------------------------------------------------------------

    def update(self, stats) -> None:
        """Append one point per plotted peer (NaN for peers that left); add new peers."""
        rows = {row.peer: row for row in stats.peers}
        left = [p for p in self.peers if p not in rows and p not in self.departed]
        back = [p for p in self.peers if p in rows and p in self.departed]
        joined = [p for p in rows if p not in self.peers]
        room = self.max_peers - len(self.peers) + len(self._rolled_out())
        joined = sorted(joined, key=lambda p: (self._name(p), str(p)))[:max(room, 0)]
        if left or back or joined or self._rolled_out():
            # Structure changes (rare) go to the browser as one whole new document, not as
            # patches: a patch sent before a view exists is lost, the document is not.
            with self.resync():
                self._forget_rolled_out()
                for peer in left:
                    self.departed[peer] = self.ticks
                    self._legend_labels[peer] = f"{self._name(peer)} (left)"
                for peer in back:  # it came back (session resumed)
                    del self.departed[peer]
                    self._legend_labels[peer] = self._name(peer)
                if joined:
                    self._add(joined)
                self._draw_legend()
        point = {"t": [stats.uptime]}
        for peer, index in self.peers.items():
            row = rows.get(peer)
            values = peer_values(row) if row is not None else None
            for suffix, (_, _, get) in METRICS.items():
                point[f"p{index}_{suffix}"] = [get(values) if values is not None else NAN]
        self.streamer(self.source, point, self.history)
        self.ticks += 1

    def _name(self, peer: uuid.UUID) -> str:
        return peer_name(peer, self.names)

    @staticmethod
    def line_width(index: int) -> float:
        """Pixels: peers plotted earlier draw wider lines (drawn below the later ones)."""
        return max(1.4, 4.0 - 0.5 * (index % 6))

    def colour(self, peer: uuid.UUID) -> str | None:
        """The colour of a plotted peer's lines (None if it is not plotted)."""
        index = self.peers.get(peer)
        return None if index is None else PALETTE[index % len(PALETTE)]

    def colours(self) -> dict[uuid.UUID, str]:
        """Every plotted peer's colour: the table shows them as the plots' legend."""
        return {peer: PALETTE[index % len(PALETTE)] for peer, index in self.peers.items()}

    def _add(self, peers: list[uuid.UUID]) -> None:
        data = dict(self.source.data)
        length = len(data["t"])
        for peer in peers:
            index = self._next_index
            self._next_index += 1
            self.peers[peer] = index
            for suffix in METRICS:
                data[f"p{index}_{suffix}"] = [NAN] * length
        self.source.data = data  # one full replace per join (rare), streams otherwise
        for peer in peers:
            index = self.peers[peer]
            color = self.colour(peer)
            # Peers with the same traffic draw the same line: earlier peers are drawn wider
            # and below, so each stays visible as a coloured edge under the later ones.
            width = self.line_width(index)
            renderers: list[GlyphRenderer[Any]] = []
            for suffix, (fig_key, dash, _) in METRICS.items():
                renderers.append(self.figures[fig_key].line(
                    x="t", y=f"p{index}_{suffix}", source=self.source, color=color,
                    line_dash=dash, line_width=width, line_alpha=0.9,
                    name=f"{peer}-{suffix}"))
            self._renderers[peer] = renderers
            self._legend_labels[peer] = self._name(peer)

    def legend_labels(self) -> list[str]:
        """The shared legend's entries, in order (a departed peer's ends in "(left)")."""
        return list(self._legend_labels.values())

    def _draw_legend(self) -> None:
        """Lay the legend's entries out left to right (called on structure changes only)."""
        entries = [(label, self.colour(peer) or "#444")
                   for peer, label in self._legend_labels.items()]
        self.legend_source.data = _legend_columns(entries)
        self.legend_toggle.args = {"source": self.legend_source,
                                   "lines": [self._renderers[p] for p in self._legend_labels]}

    def _rolled_out(self) -> list[uuid.UUID]:
        return [peer for peer, tick in self.departed.items()
                if self.ticks - tick >= self.history]

    def _forget_rolled_out(self) -> None:
        gone = self._rolled_out()
        if not gone:
            return
        data = dict(self.source.data)
        for peer in gone:
            index = self.peers.pop(peer)
            del self.departed[peer]
            for suffix in METRICS:
                data.pop(f"p{index}_{suffix}", None)
            renderers = self._renderers.pop(peer)
            for fig in self.figures.values():
                kept = [r for r in fig.renderers if r not in renderers]
                if len(kept) != len(fig.renderers):
                    fig.renderers = kept
            del self._legend_labels[peer]
        self.source.data = data

    # -- inspection (tests, notebooks) ----------------------------------------------------

    def series(self, peer: uuid.UUID, metric: str) -> list[float]:
        """The plotted values of one peer's metric (``mb_in``, ``queue_out``, ...)."""
        return list(self.source.data[f"p{self.peers[peer]}_{metric}"])


class DisplayOnlyBokehModel(BokehModel):
    """A ``jupyter_bokeh.BokehModel`` for views that only display what the kernel sends.

    jupyter_bokeh 4.1's browser side applies each patch the kernel sends and then echoes the
    resulting document events back (``ColumnsStreamed``, ``ColumnsPatched``, ``ModelChanged``);
    the stock ``BokehModel`` re-applies them, so every streamed point is appended twice on the
    kernel side (and re-sent to other views). Here those js events are ignored (counted in
    :attr:`ignored_echoes`); other events (``MessageSent``: bokeh UI events) pass through.
    Use with ``combine_events=True`` so the browser coalesces what it sends while the kernel
    is busy.
    """

    IGNORED_EVENTS = frozenset({"ColumnsStreamed", "ColumnsPatched", "ModelChanged"})

    def __init__(self, model, **kwargs) -> None:
        self.ignored_echoes = 0
        self.refreshes = 0  # whole documents sent after the first
        super().__init__(model, **kwargs)

    @contextlib.contextmanager
    def resync(self):
        """Changes made inside are not sent as patches; the whole document is sent after.

        jupyter_bokeh sends a view the document once (``render_bundle``) and then patches to
        the views that exist at that moment: a patch sent while no view has rendered yet (just
        after display, or while the page reloads) is lost for good, and later patches that
        refer to the models it added fail. Structure changes therefore replace the document,
        which the browser re-renders; only streamed points travel as patches.
        """
        document = self._document
        if document is not None:
            document.remove_on_change(self)
        try:
            yield
        finally:
            self.refresh()

    def refresh(self) -> None:
        """Send the whole current document (views re-render from it)."""
        self.refreshes += 1
        self.update_from_model(self._model)

    def stream(self, source: ColumnDataSource, data: dict[str, list], rollover: int) -> None:
        """``source.stream(data, rollover)`` at a fraction of the cost, for the sampler.

        Bokeh's ``stream`` validates the whole column data and serializes each patch with a
        reference table of every model in the document (about 1.5 ms per tick for 8 peers
        here). This appends to the kernel-side columns in place, without document events,
        and sends the browser the same PATCH-DOC / ``ColumnsStreamed`` message bokeh would
        (header, metadata, content: jupyter_bokeh's "patch" protocol). Only this widget's
        views see it: the plots are not shared with any other bokeh consumer.
        """
        columns = source.data
        for key, values in data.items():
            column = dict.__getitem__(columns, key)
            column.extend(values)
            if rollover is not None and len(column) > rollover:
                del column[:len(column) - rollover]
        if self.comm is None:
            return
        event = {"kind": "ColumnsStreamed", "model": {"id": source.id}, "attr": "data",
                 "data": {"type": "map",
                          "entries": [[key, [_number(v) for v in values]]
                                      for key, values in data.items()]},
                 "rollover": rollover}
        header = {"msgid": make_id(), "msgtype": "PATCH-DOC", "num_buffers": 0}
        for payload in (header, {}, {"events": [event]}):
            self.send({"msg": "patch",
                       "payload": json.dumps(payload, separators=(",", ":"), allow_nan=False)})

    def _sync_model(self, _model, content, _buffers) -> None:
        if content.get("event") == "jsevent" and _event_kind(content) in self.IGNORED_EVENTS:
            self.ignored_echoes += 1
            return
        super()._sync_model(_model, content, _buffers)


def _number(value: float):
    """A float as bokeh serializes it (NaN and infinities are not JSON)."""
    if value != value:
        return {"type": "number", "value": "nan"}
    if value in (math.inf, -math.inf):
        return {"type": "number", "value": "+inf" if value > 0 else "-inf"}
    return value


def _event_kind(content: dict) -> str | None:
    kind = content.get("kind")
    if kind is None and content.get("type") == "map":  # a serialized map, just in case
        for key, value in content.get("entries", ()):
            if key == "kind":
                return value
    return kind


_loaded = False


def load_bokeh(force: bool = False) -> None:
    """Load BokehJS into the notebook, inline (no CDN): once per kernel."""
    global _loaded
    if _loaded and not force:
        return
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(INLINE, hide_banner=True)
    _loaded = True
