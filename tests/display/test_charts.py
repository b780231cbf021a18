"""netq/display/charts.py: the charts' axes and the static form's inline SVG."""

from __future__ import annotations

import re

from netq.display.charts import CHART_BOTTOM, CHART_HEIGHT, CHART_TOP, chart_frame, chart_svg


def test_static_charts_keep_their_lines_inside_the_range():
    times = [0.0, 1.0, 2.0, 3.0]
    plotted = [{"key": "p0", "peer": "a", "label": "a", "colour": "#1f77b4", "width": 2}]
    memory = [0.0, 10.0, None, 30.0]
    frame = chart_frame(times, plotted, {"memory": 30.0}, history=600)
    chart = next(c for c in frame["charts"] if c["metric"] == "memory")
    series = {"p0": [[0.0, 0.0, 0.0, 0.0, m] if m is not None else None for m in memory]}
    svg = chart_svg(chart, frame, times, series)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "<script" not in svg
    assert chart["top"] >= 30.0  # the top tick is at or above every value: nothing clipped
    ys = [float(y) for y in re.findall(r"[ML][0-9.]+[ ,]([0-9.]+)", svg)]
    assert ys and all(CHART_TOP <= y <= CHART_HEIGHT - CHART_BOTTOM for y in ys)
    assert svg.count("<path ") == 1 and svg.count(" M") == 1  # the gap at None: a new stroke
