"""The monitor's charts: which samples they plot, their axes, their geometry, and the static
form's inline SVG.

Python computes every axis and label; the live widget's ES module (``widgets/frontend/
monitor.js``) draws the live charts from :func:`chart_frame` with the same geometry, and
:func:`chart_svg` draws the static ones (``netq.display.static_form``).
Values: bytes/s for throughput, messages for queues, bytes for memory; times in seconds of
the communicator's uptime.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..statistics import PeerStatistics
from .formatting import format_count, format_tick_bytes

__all__ = ("PALETTE", "PEER_COLOURS", "SAMPLE", "peer_sample", "Chart", "CHARTS", "axis_ticks",
           "time_axis", "chart_frame", "CHART_HEIGHT", "CHART_LEFT", "CHART_RIGHT", "CHART_TOP",
           "CHART_BOTTOM", "STATIC_CHART_WIDTH", "chart_svg")

# One colour per peer, in the order peers are first plotted (matplotlib's / bokeh's Category10);
# the table's swatches, the live plots and the static charts use the same one.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")

# A peer's colour in the charts, the legend and the table's swatch: 20 distinct colours (the
# default plots at most 16 peers), the first ten as before (Category10), then their light tints.
PEER_COLOURS = (*PALETTE, "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
                "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")
#: One sample of a peer, in this order: what the charts plot (bytes/s, messages, bytes).
SAMPLE = ("bytes_in_per_s", "bytes_out_per_s", "queue_in", "queue_out", "memory")


class Chart(NamedTuple):
    metric: str  # svg.netq-chart[data-metric]
    title: str
    unit: str  # "byte_rate", "count" or "bytes": how its ticks read
    lines: tuple[tuple[int, str], ...]  # (index into SAMPLE, SVG dash or "") per peer


CHARTS = (
    Chart("throughput", "throughput (solid: in, dashed: out)", "byte_rate",
          ((0, ""), (1, "5 3"))),
    Chart("queue", "queued messages (solid: in, dashed: out)", "count", ((2, ""), (3, "5 3"))),
    Chart("memory", "memory held", "bytes", ((4, ""),)),
)


def peer_sample(row: PeerStatistics) -> list[float]:
    """One row's chart values in :data:`SAMPLE` order (bytes/s, messages, bytes)."""
    return [float(getattr(row, key)) for key in SAMPLE]


def axis_ticks(highest: float, unit: str, *, intervals: int = 4) -> tuple[float, list]:
    """The y axis for values up to ``highest``: ``(top, [[value, label], ...])``, from 0 to
    ``top`` (the first tick at or above ``highest``, so no line leaves the chart) in at most
    ``intervals`` equal steps. ``unit``: ``"count"`` (integer steps: 1, 2, 5 x 10^n),
    ``"bytes"`` or ``"byte_rate"`` (binary steps: 1, 2, 4 ... 512 x 1024^n, labelled in B, KiB,
    MiB, GiB; ``/s`` for a rate)."""
    if unit == "count":
        steps = [m * 10 ** e for e in range(0, 13) for m in (1, 2, 5)]
    else:
        steps = [float(2 ** e) for e in range(0, 50)]
    target = max(highest, 0.0)
    step = next((s for s in steps if s * intervals >= target), steps[-1])
    count = max(1, math.ceil(target / step)) if target > 0 else 1
    top = step * count
    if unit == "count":
        label: Callable[[float], str] = lambda v: format_count(v)  # noqa: E731
    elif unit == "byte_rate":
        label = lambda v: f"{format_tick_bytes(v)}/s" if v else "0"  # noqa: E731
    else:
        label = format_tick_bytes
    return float(top), [[float(step * k), label(step * k)] for k in range(count + 1)]


def _uptime_tick(seconds: float) -> str:
    if seconds < 60 and abs(seconds - round(seconds)) > 1e-6:
        return f"{seconds:.1f} s"  # the sub-second steps of a young view's axis
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes == 0:
        return f"{secs} s"
    return f"{minutes} min" if secs == 0 else f"{minutes}:{secs:02d}"


def time_axis(start: float, end: float, *, intervals: int = 6) -> list:
    """Uptime ticks between ``start`` and ``end`` (seconds): ``[[t, label]]`` at the smallest
    round step that gives at most ``intervals`` steps, so a view a few seconds old gets several
    ticks (half seconds), not one or two."""
    span = max(end - start, 1e-9)
    steps = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
             14400)
    step = next((s for s in steps if span / s <= intervals), steps[-1])
    ticks = []
    index = math.ceil(start / step - 1e-9)
    while index * step <= end + 1e-9:
        value = round(index * step, 6)  # no 0.30000000000000004 from repeated sums
        ticks.append([float(value), _uptime_tick(value)])
        index += 1
    return ticks


def chart_frame(times: list[float], plotted: list[dict[str, Any]],
                highest: Mapping[str, float], history: int) -> dict[str, Any]:
    """What the charts need besides the points: the time axis, each chart's title, top and
    ticks (:func:`axis_ticks` of ``highest[metric]``) and line styles, and the plotted peers
    (``key``, ``peer``, ``label``, ``colour``, ``width``) in legend order."""
    start, end = (times[0], times[-1]) if times else (0.0, 1.0)
    if end <= start:
        end = start + 1.0
    charts = []
    for chart in CHARTS:
        top, ticks = axis_ticks(highest.get(chart.metric, 0.0), chart.unit)
        charts.append({"metric": chart.metric, "title": chart.title, "top": top,
                       "ticks": ticks, "lines": [list(line) for line in chart.lines]})
    return {"history": history, "x": {"start": start, "end": end,
                                      "ticks": time_axis(start, end)},
            "charts": charts, "plotted": plotted}


# The chart geometry, in pixels (monitor.js draws the live charts with the same numbers): the
# left margin holds the widest tick label (``512 KiB/s``), the top margin half a label's
# height so that the top tick's label is never clipped.
CHART_HEIGHT, CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM = 150, 66, 10, 10, 20
STATIC_CHART_WIDTH = 310


def chart_svg(chart: Mapping[str, Any], frame: Mapping[str, Any], times: list[float],
              series: Mapping[str, list], width: int = STATIC_CHART_WIDTH) -> str:
    """One chart of :func:`chart_frame` as inline SVG: ``svg.netq-chart[data-metric]`` with one
    ``path.netq-series[data-peer]`` per plotted peer and line (gaps where a sample is None)."""
    escape = html.escape
    height = CHART_HEIGHT
    inner_w = width - CHART_LEFT - CHART_RIGHT
    inner_h = height - CHART_TOP - CHART_BOTTOM
    start, end = frame["x"]["start"], frame["x"]["end"]
    top = chart["top"] or 1.0

    def x(t: float) -> float:
        return CHART_LEFT + (t - start) / (end - start) * inner_w

    def y(v: float) -> float:
        return CHART_TOP + inner_h - min(max(v / top, 0.0), 1.0) * inner_h

    out = [f'<svg class="netq-chart" data-metric="{escape(chart["metric"])}" '
           f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">']
    for value, label in chart["ticks"]:
        out.append(f'<line class="netq-grid" x1="{CHART_LEFT}" x2="{width - CHART_RIGHT}" '
                   f'y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
                   f'<text class="netq-tick" x="{CHART_LEFT - 5}" y="{y(value) + 3.5:.1f}" '
                   f'text-anchor="end">{escape(label)}</text>')
    for value, label in frame["x"]["ticks"]:
        out.append(f'<text class="netq-tick" x="{x(value):.1f}" y="{height - 5}" '
                   f'text-anchor="middle">{escape(label)}</text>')
    for entry in frame["plotted"]:
        samples = series.get(entry["key"], [])
        for index, dash in chart["lines"]:
            path = []
            pen = "M"
            for t, sample in zip(times, samples, strict=False):
                if sample is None or sample[index] is None:
                    pen = "M"
                    continue
                path.append(f"{pen}{x(t):.1f},{y(sample[index]):.1f}")
                pen = "L"
            if not path:
                continue
            dashed = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<path class="netq-series" data-peer="{escape(entry["peer"])}" '
                       f'data-line="{index}" fill="none" stroke="{entry["colour"]}" '
                       f'stroke-width="{entry["width"]}"{dashed} d="{" ".join(path)}">'
                       f'<title>{escape(entry["label"])}</title></path>')
    out.append(f'<rect class="netq-frame" x="{CHART_LEFT}" y="{CHART_TOP}" width="{inner_w}" '
               f'height="{inner_h}" fill="none"/></svg>')
    return "".join(out)
