"""netq.lab.notebook: what the tutorial notebooks share (figures rounded, ratio verdicts with a
tolerance, 1-2-5 ticks, the SVG bar chart, the live traffic demo on real loopback sockets)."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import pytest

from netq.lab.notebook import LiveTraffic, bar_chart, log_ticks, median_and_spread, rounded, verdict

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("value", "digits", "text"), [
    (1557023.4, 3, "1,560,000"), (0.012345, 2, "0.012"), (2.5, 3, "2.50"), (137.4, 3, "137"),
    (-0.5, 1, "-0.5"), (999.7, 3, "1,000"), (0, 3, "0"), (299.57, 2, "300"),
])
def test_rounded_keeps_significant_digits_only(value, digits, text):
    assert rounded(value, digits) == text


def test_rounded_refuses_no_digits():
    with pytest.raises(ValueError, match="digits"):
        rounded(1.0, 0)


def test_median_and_spread():
    assert median_and_spread([3.0, 1.0, 2.0, 10.0]) == (2.5, 1.0, 10.0)
    with pytest.raises(ValueError, match="no measurements"):
        median_and_spread([])


def test_verdict_calls_a_winner_only_outside_the_band():
    assert verdict(1.32, above="A faster", below="B faster") == "1.32x, A faster"
    assert verdict(0.54, above="A faster", below="B faster") == "0.54x, B faster"
    assert verdict(1.01, above="A", below="B") == "1.01x, within ±10 %: no clear difference"
    assert verdict(0.91, above="A", below="B") == "0.91x, within ±10 %: no clear difference"
    assert verdict(1.15, above="A", below="B", tolerance=0.2) == (
        "1.15x, within ±20 %: no clear difference")


def test_verdict_withholds_a_winner_when_the_rounds_disagree():
    assert verdict(1.3, above="A", below="B", rounds=[0.8, 1.3, 1.6]) == (
        "1.30x, no clear difference: the rounds fall on both sides of 1")
    assert verdict(1.3, above="A", below="B", rounds=[1.1, 1.3, 1.6]) == "1.30x, A"


@pytest.mark.parametrize(("ratio", "tolerance"), [(0.0, 0.1), (-1.0, 0.1), (1.0, 1.0), (1.0, -0.1)])
def test_verdict_refuses_what_is_no_ratio_or_no_band(ratio, tolerance):
    with pytest.raises(ValueError):
        verdict(ratio, above="A", below="B", tolerance=tolerance)


def test_log_ticks_are_the_1_2_5_values_in_range():
    assert log_ticks(0.3, 700) == [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]
    assert log_ticks(3, 4) == []
    assert log_ticks(1e-3, 2e-3) == [0.001, 0.002]
    with pytest.raises(ValueError):
        log_ticks(0, 10)


def test_bar_chart_is_svg_with_a_bar_per_label_and_escaped_text():
    svg = bar_chart("a <title>", ["x", "y&z"], [3, 7], y_label="KiB", x_label="client",
                    reference=("bound", 5))
    root = ET.fromstring(svg)  # well-formed XML: every text was escaped
    namespace = "{http://www.w3.org/2000/svg}"
    bars = [rect for rect in root.iter(f"{namespace}rect")
            if rect.find(f"{namespace}title") is not None]
    assert [bar.find(f"{namespace}title").text for bar in bars] == ["x: 3", "y&z: 7"]
    assert float(bars[1].get("height")) > float(bars[0].get("height")) > 0
    assert "a <title>" in [text.text for text in root.iter(f"{namespace}text")]
    ticks = [float(t.text) for t in root.iter(f"{namespace}text") if t.get("text-anchor") == "end"]
    assert ticks == [0, 2, 4, 6, 8]  # 1-2-5 steps up to 1.15 x the highest value


def test_bar_chart_needs_a_value_per_label():
    with pytest.raises(ValueError, match="one value per label"):
        bar_chart("t", ["a", "b"], [1], y_label="y", x_label="x", reference=("r", 1))


def test_live_traffic_flows_and_stops_closing_everything():
    live = LiveTraffic(minutes=1, clients=2, tick=0.01, size=64, timeout=10)
    try:
        deadline = time.monotonic() + 30
        while live.received < 30:  # client 0 puts 1 per tick, client 1 puts 2
            assert time.monotonic() < deadline, f"only {live.received} messages in 30 s"
            time.sleep(0.01)
        assert live.running and len(live.clients) == 2
        assert sorted(live.names.values()) == ["live-0", "live-1"]
    finally:
        received = live.stop()
    assert received >= 30 and not live.running
    assert live.server.closed and all(client.closed for client in live.clients)


def test_live_traffic_ends_by_itself_after_its_time():
    live = LiveTraffic(minutes=0.5 / 60, clients=1, tick=0.01, timeout=10)
    live._thread.join(30)
    assert not live.running and live.server.closed


def test_live_traffic_refuses_nonsense():
    with pytest.raises(ValueError):
        LiveTraffic(minutes=0)
