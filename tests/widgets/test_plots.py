"""widgets/plots.py without a browser: PeerPlots' source/root/update() and the echo fix."""

from __future__ import annotations

import math
import uuid

import pytest
from jupyter_bokeh import BokehModel
from netq.widgets import DisplayOnlyBokehModel, PeerPlots

from netq.display import MiB
from widget_testing import make_row, make_stats, same_columns

A, B, C = (uuid.UUID(int=i) for i in (0xA0, 0xB0, 0xC0))
NAMES = {A: "alpha", B: "bravo", C: "charlie"}


def tick(plots, t, *rows):
    plots.update(make_stats(rows, now=t))


def test_one_point_per_tick_for_each_peer_in_plot_units():
    plots = PeerPlots(NAMES)
    tick(plots, 1.0, make_row(A, bytes_in_per_s=2 * MiB, bytes_out_per_s=MiB / 2, queue_in=3,
                              queue_out=1, memory=3 << 20))
    assert plots.source.data["t"] == [1.0]
    assert plots.series(A, "mb_in") == [2.0] and plots.series(A, "mb_out") == [0.5]  # MiB/s
    assert plots.series(A, "queue_in") == [3.0] and plots.series(A, "queue_out") == [1.0]
    assert plots.series(A, "memory") == [3.0]  # MiB
    # one line per metric on the right figure, one legend entry per peer
    lines = {r.glyph.y for fig in plots.figures.values() for r in fig.renderers}
    assert lines == {f"p0_{m}" for m in ("mb_in", "mb_out", "queue_in", "queue_out", "memory")}
    assert plots.legend_labels() == ["alpha"]


def test_rollover_keeps_the_last_history_points():
    plots = PeerPlots(NAMES, history=5)
    for t in range(12):
        tick(plots, float(t), make_row(A, queue_in=t))
    assert plots.source.data["t"] == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert plots.series(A, "queue_in") == [7.0, 8.0, 9.0, 10.0, 11.0]


def test_peers_join_at_runtime_and_their_past_is_nan():
    plots = PeerPlots(NAMES)
    tick(plots, 1.0, make_row(A, queue_in=1))
    tick(plots, 2.0, make_row(A, queue_in=2))
    tick(plots, 3.0, make_row(A, queue_in=3), make_row(B, queue_in=30))
    assert plots.series(A, "queue_in") == [1.0, 2.0, 3.0]
    past = plots.series(B, "queue_in")
    assert math.isnan(past[0]) and math.isnan(past[1]) and past[2] == 30.0
    assert plots.legend_labels() == ["alpha", "bravo"]
    assert len(plots.figures["throughput"].renderers) == 4  # in + out per peer


def test_a_peer_that_leaves_ends_its_lines_and_is_dropped_once_rolled_out():
    plots = PeerPlots(NAMES, history=4)
    tick(plots, 1.0, make_row(A), make_row(B, queue_in=5))
    tick(plots, 2.0, make_row(A))  # B left
    assert math.isnan(plots.series(B, "queue_in")[-1])
    assert plots.legend_labels() == ["alpha", "bravo (left)"]
    for t in range(3, 7):
        tick(plots, float(t), make_row(A))
    assert B not in plots.peers
    assert not any(key.startswith("p1_") for key in plots.source.data)
    assert plots.legend_labels() == ["alpha"]
    assert len(plots.figures["memory"].renderers) == 1


def test_at_most_max_peers_are_plotted():
    plots = PeerPlots(NAMES, max_peers=2)
    tick(plots, 1.0, make_row(A), make_row(B), make_row(C))
    assert set(plots.peers) == {A, B}


@pytest.mark.filterwarnings("ignore:reference already known")  # the stock model's replay
def test_the_browser_echo_is_ignored(frontend):
    """Regression: jupyter_bokeh 4.1 re-applies the browser's echo of each streamed patch.

    The browser applies every PATCH-DOC and sends the resulting events back; the stock
    BokehModel applies them again, duplicating every point on the kernel side (the design
    notes measured 60 points, 32 unique). Replayed here with the exact events the kernel sent.
    """
    def run(model_class):
        plots = PeerPlots(NAMES, history=50)
        widget = model_class(plots.root, combine_events=True)
        for t in range(10):
            tick(plots, float(t), make_row(A, queue_in=t), *([make_row(B)] if t >= 4 else []))
        before = {key: list(values) for key, values in plots.source.data.items()}
        # what the browser holds equals what the kernel sent
        assert same_columns(frontend.source(plots.source), before)
        echoed = frontend.echo(widget)
        frontend.patches.clear()
        return plots, widget, before, echoed

    plots, widget, before, echoed = run(DisplayOnlyBokehModel)
    assert echoed >= 10 and widget.ignored_echoes == echoed
    assert same_columns(dict(plots.source.data), before)
    assert plots.source.data["t"] == [float(t) for t in range(10)]

    # The same replay on the stock model shows the bug this guards against.
    plots, widget, before, echoed = run(BokehModel)
    t = plots.source.data["t"]
    assert len(t) > len(before["t"]) and len(set(t)) < len(t)  # duplicated points


def test_the_fast_stream_sends_what_bokeh_would(frontend):
    plots = PeerPlots(NAMES, history=3)
    widget = DisplayOnlyBokehModel(plots.root, combine_events=True)
    tick(plots, 1.0, make_row(A, queue_in=1))  # bokeh's own source.stream()
    theirs = frontend.patches[-1]["events"][0]
    plots.streamer = widget.stream
    for t in range(2, 6):
        tick(plots, float(t), make_row(A, queue_in=t), *([make_row(B)] if t == 5 else []))
    ours = [e for p in frontend.patches for e in p["events"] if e["kind"] == "ColumnsStreamed"]
    assert set(ours[-2]) == set(theirs)
    assert {k: ours[-2][k] for k in ("kind", "model", "attr", "rollover")} == \
        {k: theirs[k] for k in ("kind", "model", "attr", "rollover")}
    assert [k for k, _ in ours[-2]["data"]["entries"]] == [k for k, _ in theirs["data"]["entries"]]
    # kernel side: rolled over in place; browser side (replayed): the same, NaN included
    assert plots.source.data["t"] == [3.0, 4.0, 5.0]
    assert plots.series(A, "queue_in") == [3.0, 4.0, 5.0]
    assert same_columns(frontend.source(plots.source), dict(plots.source.data))
    assert math.isnan(frontend.source(plots.source)["p1_queue_in"][0])
