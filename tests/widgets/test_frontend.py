"""widgets/frontend/monitor.js alone in a real browser: Debian's chromium driven by playwright.

The ES module is imported into a blank page (from a blob URL: no server, no network) and given
a small in-page model with anywidget's interface (get / set / on / off / save_changes / send),
holding the traits a real ``Monitor`` computed for 32 peers. What is checked is the layout
people see: the whole view within 1000 x 900 px, one legend entry per plotted peer, every
plotted line drawn, the top tick label inside its chart, sorting, filtering, the snapshot form,
and no console error. A screenshot goes to ``test-artifacts/monitor-esm-32.png``.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from netq.widgets import Monitor
from netq.widgets.monitor import FRONTEND

from browser_testing import CHROMIUM, chromium_missing
from netq.display.formatting import MiB
from widget_testing import make_row, make_stats

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("NETQ_TEST_ARTIFACTS", REPO / "test-artifacts"))
PEERS = 32

# The in-page model: what anywidget hands to initialize() and render().
HARNESS = """
async ([code, css, state]) => {
  class Model {
    constructor(state) { this.state = state; this.handlers = {}; this.sent = []; }
    get(key) { return this.state[key]; }
    set(key, value) { this.state[key] = value; this.emit("change:" + key); }
    save_changes() {}
    send(message) { this.sent.push(message); }
    on(name, callback) { (this.handlers[name] = this.handlers[name] || []).push(callback); }
    off(name, callback) {
      this.handlers[name] = (this.handlers[name] || []).filter((c) => c !== callback);
    }
    emit(name, ...args) { for (const callback of this.handlers[name] || []) callback(...args); }
  }
  const style = document.createElement("style");
  style.textContent = css;
  document.head.appendChild(style);
  const url = URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
  const widget = (await import(url)).default;
  const model = new Model(state);
  const el = document.createElement("div");
  el.id = "output";
  document.body.appendChild(el);
  widget.initialize({ model });
  widget.render({ model, el });
  window.netqModel = model;
}
"""


def states() -> tuple[dict, dict, list[dict]]:
    """A real Monitor's traits after 40 samples of 32 peers: (first state, history answer,
    the following three points' states)."""
    peers = [uuid.UUID(int=i + 1) for i in range(PEERS)]
    names = {peer: f"client-{i:02d}-with-a-long-name" for i, peer in enumerate(peers)}
    blocked = f"peer {peers[5]} has granted no credit for 6 s: its code is not calling get()"

    def snapshot(t: int):
        rows = [make_row(peer, bytes_in_per_s=(i % 9 + 1) * (t % 5 + 1) * 0.3 * MiB,
                         messages_in_per_s=float(i), queue_in=(i + t) % 7,
                         queue_out=i % 3, memory=(i + 1) * 70_000,
                         credit_in=-512 if i == 2 else 65_536,
                         blocked=blocked if i == 5 else "", blocked_for=6.0)
                for i, peer in enumerate(peers)]
        return make_stats(rows, now=float(t))

    class Frozen:
        id = uuid.uuid4()

        def statistics(self):
            return snapshot(0)

    class Sampled(Monitor):
        running = True  # as if its sampler ran: the view is the live one

    monitor = Sampled(Frozen(), names=names, history=600, max_rows=50, max_peers=16)
    for t in range(1, 40):
        monitor.update(snapshot(t))
    first = {"view": monitor.widget.view, "frame": monitor.widget.frame,
             "point": monitor.widget.point}
    history = monitor.plots.history_message()
    later = []
    for t in range(40, 43):
        monitor.update(snapshot(t))
        later.append({"view": monitor.widget.view, "frame": monitor.widget.frame,
                      "point": monitor.widget.point})
    return json.loads(json.dumps(first)), json.loads(json.dumps(history)), later


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    if (missing := chromium_missing()) is not None:
        pytest.skip(missing)
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.mark.timeout(90)
def test_32_peers_fit_1000_by_900_with_every_plotted_peer_in_the_legend(browser):
    first, history, later = states()
    code = (FRONTEND / "monitor.js").read_text()
    css = (FRONTEND / "monitor.css").read_text()
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.set_content("<!DOCTYPE html><html><body style='margin:8px'></body></html>")
        page.evaluate(HARNESS, [code, css, first])
        assert page.evaluate("window.netqModel.sent") == [{"type": "history"}]
        page.evaluate("h => window.netqModel.emit('msg:custom', h)", history)
        for state in later:  # the sampler's next ticks: one update message each
            page.evaluate("s => { for (const k of ['view', 'frame', 'point'])"
                          " window.netqModel.set(k, s[k]); }", state)
        plotted = later[-1]["frame"]["plotted"]
        page.wait_for_function(
            "n => document.querySelectorAll('svg.netq-chart path.netq-series').length >= n",
            arg=len(plotted) * 5, timeout=10_000)
        root = page.locator("div.netq-view.netq-monitor")
        assert root.get_attribute("data-live") == "1"
        assert page.locator(".netq-snapshot").count() == 0
        box = root.bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= 1000 and box["y"] + box["height"] <= 900, box

        # legend: one entry per plotted peer, whole names (wrapping, never truncated)
        entries = page.locator(".netq-legend .netq-legend-entry")
        assert entries.count() == len(plotted) == 16
        assert entries.evaluate_all("es => es.map(e => e.dataset.peer)") == \
            [entry["peer"] for entry in plotted]
        assert entries.evaluate_all(
            "es => es.every(e => e.scrollWidth <= e.clientWidth + 1)")
        # every plotted peer's lines, in its colour, in each chart
        for chart, lines in (("throughput", 2), ("queue", 2), ("memory", 1)):
            series = page.locator(f'svg.netq-chart[data-metric="{chart}"] path.netq-series')
            assert series.count() == len(plotted) * lines
        # the top tick label is inside its chart; the queue axis counts whole messages
        for chart in page.locator("svg.netq-chart").all():
            chart_box = chart.bounding_box()
            labels = chart.locator("text.netq-tick").all()
            tops = [label.bounding_box()["y"] for label in labels]
            assert chart_box is not None and min(tops) >= chart_box["y"] - 0.5
        queue_labels = page.locator('svg.netq-chart[data-metric="queue"] text.netq-tick')
        y_labels = queue_labels.all_text_contents()[:len(later[-1]["frame"]["charts"][1][
            "ticks"])]
        assert all(label.isdigit() for label in y_labels), y_labels
        # the table: 32 peer rows (busiest first), a total, swatches of plotted peers
        rows = page.locator("table.netq-peers tr.netq-peer")
        assert rows.count() == PEERS and page.locator("tr.netq-total").count() == 1
        assert page.locator("tr.netq-peer .netq-swatch").count() == len(plotted)
        assert page.locator("tr.netq-blocked").count() == 1
        assert "client-05-with-a-long-name" in page.locator("ul.netq-waiting li").inner_text()
        assert page.locator("sup.netq-mark").count() == 1  # the negative credit, explained
        assert "up to one message" in page.locator(".netq-notes").inner_text()
        badge = page.locator(".netq-title .netq-badge")
        assert badge.get_attribute("data-state") == "waiting"
        # the clock moves with each sample
        uptime = page.locator(".netq-uptime").inner_text()
        assert uptime == later[-1]["view"]["title"]["uptime"]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "monitor-esm-32.png"))

        # sorting by a header, client side
        page.locator('th[data-sort="peer"]').click()
        names = rows.evaluate_all("rs => rs.map(r => r.dataset.peer)")
        assert names == sorted(names)
        page.locator('th[data-sort="peer"]').click()
        assert rows.evaluate_all("rs => rs.map(r => r.dataset.peer)") == sorted(names,
                                                                                 reverse=True)
        # filtering the rows sent
        page.locator("input.netq-filter").fill("client-1")
        assert rows.count() == 10  # client-10 ... client-19
        page.locator("input.netq-filter").fill("")
        assert rows.count() == PEERS
        # a click on a legend entry hides that peer's lines, another shows them
        name = plotted[0]["peer"]
        page.locator(f'.netq-legend-entry[data-peer="{name}"]').click()
        page.wait_for_function(
            "n => !document.querySelector(`path.netq-series[data-peer=\"${n}\"]`)", arg=name)
        page.locator(f'.netq-legend-entry[data-peer="{name}"]').click()
        page.wait_for_function(
            "n => !!document.querySelector(`path.netq-series[data-peer=\"${n}\"]`)", arg=name)

        # stopped: the same widget turns into a snapshot that says so
        stopped = dict(later[-1]["view"], live=False,
                       snapshot="snapshot taken 21:30:05, not live (the view was stopped)")
        stopped["title"] = dict(stopped["title"], state="stopped", label="stopped")
        page.evaluate("v => window.netqModel.set('view', v)", stopped)
        assert root.get_attribute("data-live") == "0"
        assert "snapshot taken 21:30:05" in page.locator(".netq-snapshot").inner_text()
        assert badge.get_attribute("data-state") == "stopped"
        assert not errors, errors
    finally:
        page.close()


@pytest.mark.timeout(60)
def test_a_live_view_that_hears_nothing_says_it_is_a_snapshot(browser):
    """A kernel that dies (or a frontend that stops relaying updates) must not leave a frozen
    view that looks live: past ``stale_after_ms`` without an update the badge reads snapshot
    and the view says since when; the next update makes it live again."""
    first, _, later = states()
    first["view"]["stale_after_ms"] = 1500
    code = (FRONTEND / "monitor.js").read_text()
    css = (FRONTEND / "monitor.css").read_text()
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.set_content("<!DOCTYPE html><html><body></body></html>")
        page.evaluate(HARNESS, [code, css, first])
        root = page.locator(".netq-monitor")
        badge = page.locator(".netq-badge")
        assert root.get_attribute("data-live") == "1"
        assert badge.get_attribute("data-state") not in ("snapshot", "stopped", "closed")
        page.wait_for_function(
            "() => document.querySelector('.netq-monitor').dataset.live === '0'", timeout=15000)
        assert badge.get_attribute("data-state") == "snapshot"
        said = page.locator(".netq-snapshot").inner_text()
        assert f"snapshot taken {first['view']['taken']}, not live" in said
        assert "no update from the kernel" in said
        page.evaluate("v => window.netqModel.set('view', v)", dict(later[0]["view"],
                                                                     stale_after_ms=1500))
        assert root.get_attribute("data-live") == "1"
        assert badge.get_attribute("data-state") not in ("snapshot", "stopped", "closed")
        assert page.locator(".netq-snapshot").count() == 0
        assert not errors, errors
    finally:
        page.close()
