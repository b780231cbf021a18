"""What the monitor's synced traits carry, without a browser: snapshots built by hand go through
``PlotHistory`` and ``netq.display``'s view model and charts (busiest-first order, the
``others`` row, the bounded history, the ticks the module draws, names for ids, the static form
never live)."""

from __future__ import annotations

import json
import re
import uuid

from netq.widgets import Monitor, PlotHistory
from netq.widgets.monitor import HYSTERESIS

from netq.display import formatting, static_form, tables, view_model
from netq.display.charts import CHART_BOTTOM, CHART_HEIGHT, CHART_TOP, axis_ticks, time_axis
from netq.display.formatting import MiB
from widget_testing import make_row, make_stats

A, B, C = (uuid.UUID(int=i) for i in (0xA0, 0xB0, 0xC0))
NAMES = {A: "alpha", B: "bravo", C: "charlie"}


class Frozen:
    """A communicator that returns the snapshot it is given (no network)."""

    def __init__(self, stats) -> None:
        self.stats = stats
        self.id = stats.id

    def statistics(self):
        return self.stats


def tick(plots, t, *rows):
    plots.update(make_stats(rows, now=t))


def many(count: int, *, busy: int = 0):
    """``count`` peers; peer ``i < busy`` sends ``i + 1`` MiB/s, the others are idle."""
    peers = [uuid.UUID(int=i + 1) for i in range(count)]
    rows = [make_row(p, bytes_in_per_s=(i + 1) * MiB if i < busy else 0.0,
                     messages_in_per_s=(i + 1) * 10.0 if i < busy else 0.0, queue_in=i)
            for i, p in enumerate(peers)]
    return peers, rows


def test_history_is_bounded_and_only_the_newest_point_travels_each_tick():
    plots = PlotHistory(NAMES, history=5)
    for t in range(12):
        tick(plots, float(t), make_row(A, queue_in=t, bytes_in_per_s=2 * MiB))
    assert list(plots.times) == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert plots.series(A, "queue_in") == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert plots.series(A, "bytes_in_per_s") == [2 * MiB] * 5  # plotted in bytes/s
    # four significant digits on the wire: what a chart a few hundred pixels high can show
    assert plots.point() == {"t": 11.0, "values": {str(A): [2.097e6, 0.0, 11.0, 0.0, 0.0]}}
    message = plots.history_message()
    assert len(message["t"]) == 5 and len(message["series"][str(A)]) == 5


def test_the_sampled_json_is_bounded_by_the_plotted_peers_not_the_peers():
    """500 peers: the table sends max_rows rows + one aggregate, the point max_peers samples."""
    peers, rows = many(500, busy=40)
    monitor = Monitor(Frozen(make_stats(rows, now=1.0)), max_rows=50, max_peers=16,
                      history=600)
    for t in range(2, 12):
        monitor.update(make_stats(rows, now=float(t)))
    assert len(monitor.widget.point["values"]) == 16
    assert len(json.dumps(monitor.widget.point)) < 2500
    assert len(monitor.widget.view["rows"]) == 50
    assert monitor.widget.view["others"]["count"] == 450
    assert len(json.dumps(monitor.widget.frame)) < 6000


def test_busiest_first_with_a_total_and_one_others_row():
    peers, rows = many(60, busy=60)
    view = view_model.monitor_view(make_stats(rows), max_rows=50, live=True)
    names = [row["peer"] for row in view["rows"]]
    # peer i sends i + 1 MiB/s: the busiest (the last made) first
    assert names == [tables.peer_name(p) for p in reversed(peers)][:50]
    assert len(view["rows"]) == 50
    others = view["others"]
    keys = [key for key, _, _ in view["columns"]]
    cells = dict(zip(keys, others["cells"], strict=True))
    assert others["count"] == 10 and cells["peer"] == "others (10 peers)"
    assert cells["mb_in"] == formatting.format_rate(sum(range(1, 11)))  # the 10 quietest
    assert cells["queue_in"] == formatting.format_count(sum(range(10)))
    total = dict(zip(keys, view["total"], strict=True))
    assert total["peer"] == "total" and total["mb_in"] == formatting.format_rate(sum(range(1, 61)))
    # same bytes/s: more messages/s first, then by name
    tie = [make_row(A, bytes_in_per_s=MiB, messages_in_per_s=1.0),
           make_row(B, bytes_in_per_s=MiB, messages_in_per_s=5.0),
           make_row(C, bytes_in_per_s=MiB, messages_in_per_s=1.0)]
    order = [r.peer for r in view_model.busiest_first(tie, {A: "zulu", C: "charlie"})]
    assert order == [B, C, A]
    assert view_model.monitor_view(make_stats(rows[:3]), max_rows=50)["others"] is None


def test_at_most_max_peers_are_plotted_the_busiest_and_places_change_slowly():
    peers, rows = many(10, busy=10)
    plots = PlotHistory(history=50, max_peers=3)
    plots.update(make_stats(rows, now=1.0))
    assert plots.peers == [peers[9], peers[8], peers[7]]  # the three busiest
    assert len(plots.colours()) == 3 and len(set(plots.colours().values())) == 3
    # peer 0 becomes the busiest: it takes the quietest place at the HYSTERESIS-th sample
    # that place's peer spends outside the busiest three
    rows[0] = make_row(peers[0], bytes_in_per_s=100 * MiB)
    for t in range(1, HYSTERESIS):
        plots.update(make_stats(rows, now=1.0 + t))
        assert peers[0] not in plots.peers
    plots.update(make_stats(rows, now=1.0 + HYSTERESIS))
    assert peers[0] in plots.peers and peers[7] not in plots.peers
    assert len(plots.peers) == 3
    past = plots.series(peers[0], "bytes_in_per_s")
    assert all(value != value for value in past[:-1]) and past[-1] == 100 * MiB  # no past


def test_a_peer_that_leaves_ends_its_lines_says_so_and_is_dropped_once_rolled_out():
    plots = PlotHistory(NAMES, history=4)
    tick(plots, 1.0, make_row(A), make_row(B, queue_in=5))
    tick(plots, 2.0, make_row(A))  # B left
    assert plots.point()["values"][str(B)] is None
    assert [e["label"] for e in plots.legend()] == ["alpha", "bravo (left)"]
    for t in range(3, 7):
        tick(plots, float(t), make_row(A))
    assert plots.peers == [A] and not plots.departed
    assert [e["label"] for e in plots.legend()] == ["alpha"]


def test_a_picture_keeps_the_lines_of_peers_dropped_from_the_plot_after_it():
    """A frozen view shows the picture taken before its communicator's peers began to leave.
    The plotted peers leaving first lose their places to peers still there: the window up to
    that picture still holds their lines, and its static form draws them."""
    D = uuid.UUID(int=0xD0)
    plots = PlotHistory(NAMES, history=50, max_peers=2)
    busy = [make_row(A, bytes_in_per_s=3 * MiB), make_row(B, bytes_in_per_s=2 * MiB)]
    idle = [make_row(C), make_row(D)]
    tick(plots, 1.0, *busy, *idle)
    tick(plots, 2.0, *busy, *idle)
    picture = make_stats(busy + idle, now=2.0)
    frame = plots.frame()
    tick(plots, 3.0, *idle)  # A and B left: C and D take their places
    assert set(plots.peers) == {C, D}
    times, series = plots.window(2.0)
    assert times == [1.0, 2.0]
    assert [sample[0] for sample in series[str(A)]] == [3.146e6, 3.146e6]
    assert [sample[0] for sample in series[str(B)]] == [2.097e6, 2.097e6]
    view = view_model.monitor_view(picture, NAMES, live=False)
    drawn = re.findall(r'class="netq-series" data-peer="([^"]+)"',
                       static_form.monitor_html(view, frame, times, series))
    assert {"alpha", "bravo"} <= set(drawn)
    for t in range(4, 60):  # once rolled out of the window, they are forgotten
        tick(plots, float(t), *idle)
    assert str(A) not in plots.window(59.0)[1]


def test_ticks_integers_for_counts_binary_units_for_bytes_top_above_every_value():
    plots = PlotHistory(NAMES, history=10)
    tick(plots, 1.0, make_row(A, queue_in=7, queue_out=3, bytes_in_per_s=3.3 * MiB,
                              memory=1536 * 1024))
    tick(plots, 2.0, make_row(A, queue_in=2, bytes_in_per_s=0.5 * MiB, memory=0))
    charts = {chart["metric"]: chart for chart in plots.frame()["charts"]}
    queue = charts["queue"]
    assert queue["top"] >= 7
    assert all(re.fullmatch(r"\d+", label) for _, label in queue["ticks"])
    assert all(value == int(value) for value, _ in queue["ticks"])
    throughput = charts["throughput"]
    assert throughput["top"] >= 3.3 * MiB and throughput["ticks"][-1][0] == throughput["top"]
    assert [label for _, label in throughput["ticks"]][1:] == [
        "1 MiB/s", "2 MiB/s", "3 MiB/s", "4 MiB/s"]
    assert all(label.endswith("iB") or label == "0" for _, label in charts["memory"]["ticks"])
    assert axis_ticks(0, "count") == (1.0, [[0.0, "0"], [1.0, "1"]])
    # a fraction of a message never shows, whatever the range
    for highest in (1, 3, 9, 11, 99, 101, 12345):
        top, ticks = axis_ticks(highest, "count")
        assert top >= highest and len(ticks) <= 5
        assert all(value == int(value) for value, _ in ticks)
    # the time axis: round steps inside the window, at least three ticks however young
    assert time_axis(12.3, 17.5) == [[13.0, "13 s"], [14.0, "14 s"], [15.0, "15 s"],
                                             [16.0, "16 s"], [17.0, "17 s"]]
    assert [label for _, label in time_axis(1.0, 2.9)] == ["1 s", "1.5 s", "2 s",
                                                                   "2.5 s"]
    for start, end in ((0, 0.4), (0.3, 2.9), (5, 65), (0, 600), (100, 3700)):
        ticks = time_axis(start, end)
        assert 3 <= len(ticks) <= 7 and all(start <= t <= end for t, _ in ticks), ticks


def test_names_replace_ids_in_every_sentence_and_a_waiting_get_turns_the_badge_red():
    why = f"peer {B} has granted no credit for 6 s: its code is not calling get()"
    stats = make_stats([make_row(A), make_row(B, blocked=why, blocked_for=6.0)])
    view = view_model.monitor_view(stats, NAMES, live=True)
    assert view["title"]["state"] == "waiting"
    blocked = {row["peer"]: row["blocked"] for row in view["rows"]}
    assert blocked["bravo"] == why.replace(str(B), "bravo") and str(B) not in blocked["bravo"]
    assert any("bravo waits 6 s" in line and str(B) not in line for line in view["waiting"])
    # nothing blocked per peer, but a get() has waited: still waiting, and said where
    idle = make_stats([make_row(A)])
    import dataclasses

    idle = dataclasses.replace(idle, get_waiting=f"get() has waited 7 s for {A}")
    view = view_model.monitor_view(idle, NAMES, live=True)
    assert view["title"]["state"] == "waiting"
    assert view["waiting"] == ["get() has waited 7 s for alpha"]
    assert tables.title_state(idle) == "waiting"


def test_a_negative_credit_is_explained_where_it_shows():
    stats = make_stats([make_row(A, credit_in=-1024), make_row(B, credit_out=4096)])
    view = view_model.monitor_view(stats, NAMES)
    marks = {row["peer"]: row["marks"] for row in view["rows"]}
    assert marks["alpha"] == {"credit_in": "negative-credit"} and marks["bravo"] == {}
    assert view["notes"] == {"negative-credit": view_model.NEGATIVE_CREDIT}
    assert "up to one message" in view_model.NEGATIVE_CREDIT
    markup = static_form.monitor_html(view)
    assert markup.count('class="netq-mark"') == 1 and "up to one message" in markup
    assert view_model.monitor_view(make_stats([make_row(A)]))["notes"] == {}


def test_a_static_form_is_never_live_and_says_when_it_was_taken():
    for state, expected in (("open", "snapshot"), ("closing", "snapshot"),
                            ("closed", "closed")):
        stats = make_stats([make_row(A)], state=state)
        view = view_model.monitor_view(stats, NAMES, live=False, taken_at=0.0)
        assert view["title"]["state"] == expected and not view["live"]
        assert re.fullmatch(r"snapshot taken \d\d:\d\d:\d\d, not live.*", view["snapshot"])
        markup = static_form.monitor_html(view).split("</style>", 1)[1]
        assert 'data-live="0"' in markup and 'class="netq-snapshot"' in markup
        assert f'data-state="{expected}"' in markup and "<script" not in markup
    stopped = view_model.monitor_view(make_stats([make_row(A)]), live=False, view_state="stopped")
    assert stopped["title"]["state"] == "stopped" and "stopped" in stopped["snapshot"]
    live = view_model.monitor_view(make_stats([make_row(A)]), live=True)
    assert live["snapshot"] == "" and live["title"]["state"] in view_model.LIVE_STATES


def test_the_static_charts_draw_every_plotted_line_inside_the_frame():
    plots = PlotHistory(NAMES, history=10)
    for t in range(5):
        tick(plots, float(t), make_row(A, queue_in=t, bytes_in_per_s=t * MiB),
             *([make_row(B, queue_in=1)] if t >= 2 else []))
    view = view_model.monitor_view(make_stats([make_row(A)]), NAMES, colours=plots.colours())
    markup = static_form.monitor_html(view, plots.frame(), list(plots.times), plots.series_json())
    assert markup.count('<svg class="netq-chart"') == 3
    assert {m for m in re.findall(r'data-metric="([a-z]+)"', markup)} == {
        "throughput", "queue", "memory"}
    assert markup.count('class="netq-legend-entry"') == 2
    ys = [float(y) for d in re.findall(r' d="([^"]+)"', markup)
          for y in re.findall(r",([0-9.]+)", d)]
    bottom = CHART_HEIGHT - CHART_BOTTOM
    assert ys and all(CHART_TOP <= y <= bottom for y in ys)
    json.dumps(plots.frame(), allow_nan=False)  # no NaN on the wire
    json.dumps(plots.history_message(), allow_nan=False)
