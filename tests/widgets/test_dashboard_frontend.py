"""widgets/frontend/dashboard.js alone in a real browser: Debian's chromium driven by the
playwright package (never ``playwright install``), a plain page importing the ES module with
a small in-page model (get/set/on/off/save_changes/send, as anywidget gives it) fed with the
``view`` trait of a real Dashboard over real communicators on 127.0.0.1: 33 links (32 clients
with long names, one of them sending, and a link that waits because its server never calls
get()). Nothing may overflow horizontally at 760, 1000 and 1400 px, waits are one line each,
the page logs no error; the static form (no script) fits likewise.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from netq.widgets.dashboard import FRONTEND, Dashboard

import netq as nq
from browser_testing import CHROMIUM, chromium_missing
from netq_testing import wait_for

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CLIENTS = 32

PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body { margin: 0; font-family: sans-serif; }
#output { box-sizing: border-box; padding: 0 12px; width: 100%; }
</style></head><body><div id="output"></div></body></html>"""

# Load the module from its source and render it into #output with an in-page model.
MOUNT = """async ([source, css, view]) => {
  const style = document.createElement("style");
  style.textContent = css;
  document.head.appendChild(style);
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const module = await import(url);
  const listeners = {};
  const state = { view };
  window.model = {
    get: (key) => state[key],
    set: (key, value) => {
      state[key] = value;
      for (const callback of listeners["change:" + key] || []) callback();
    },
    on: (name, callback) => { (listeners[name] = listeners[name] || []).push(callback); },
    off: (name, callback) => {
      listeners[name] = (listeners[name] || []).filter((c) => c !== callback);
    },
    save_changes: () => {},
    send: () => {},
  };
  window.cleanup = module.default.render({ model: window.model,
                                           el: document.getElementById("output") });
  return typeof window.cleanup;
}"""

# What the layout checks read: overflow of the view, its tables and the page; the rows.
MEASURE = """() => {
  const root = document.querySelector(".netq-view.netq-dashboard");
  const width = root.clientWidth;
  const tables = [...root.querySelectorAll("table")].map((t) => t.offsetWidth);
  const summaries = [...root.querySelectorAll("details.netq-stall > summary")]
    .map((s) => s.getBoundingClientRect().height);
  const rootRight = root.getBoundingClientRect().right;
  const sticking = [...root.querySelectorAll("td, th, svg.netq-map, .netq-stalls, .netq-title")]
    .filter((e) => e.getBoundingClientRect().right > rootRight + 0.5).length;
  return {
    live: root.dataset.live,
    badge: root.querySelector(".netq-title .netq-badge").dataset.state,
    clock: root.querySelector(".netq-title .netq-uptime").textContent,
    snapshot: (root.querySelector(".netq-snapshot") || {}).textContent || "",
    width, scrollWidth: root.scrollWidth, tables, sticking, summaries,
    pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
    height: root.getBoundingClientRect().height,
    links: root.querySelectorAll("tr.netq-link").length,
    linksWithSparkline: root.querySelectorAll("tr.netq-link svg.netq-sparkline").length,
    others: root.querySelectorAll("tr.netq-others").length,
    communicators: root.querySelectorAll("tr.netq-communicator[data-name]").length,
    map: root.querySelectorAll("svg.netq-map .netq-node").length,
    text: root.textContent,
  };
}"""


def _playwright():
    if (missing := chromium_missing()) is not None:
        pytest.skip(missing)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing (pip install -e '.[dev]')")
    return sync_playwright


@pytest.fixture(scope="module")
def views():
    """The live and static forms of a real dashboard of 33 links, one of them waiting."""
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
    stalled = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=0),
        connection=nq.ConnectionOptions(recv_budget=256 << 10, stall_warning=0.3)))
    communicators = [server, stalled]
    names = {server.id: "ingest-server-on-the-loopback-interface",
             stalled.id: "server-that-never-calls-get"}
    try:
        clients = []
        for index in range(CLIENTS):
            client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
                netloc=nq.NetworkLocation(host="127.0.0.1", port=server.address[1])))
            communicators.append(client)
            clients.append(client)
            names[client.id] = f"worker-with-a-rather-long-descriptive-name-{index:02d}"
        worker = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(host="127.0.0.1", port=stalled.address[1]),
            connection=nq.ConnectionOptions(stall_warning=0.3)))
        communicators.append(worker)
        names[worker.id] = "worker-whose-server-never-reads"
        ids = {client.id for client in clients}
        wait_for(lambda: {r.peer for r in server.statistics().peers} >= ids, 60,
                 message=f"{CLIENTS} clients connected")
        board = Dashboard(interval=0.1, names=names, start=True)
        for _ in range(8):  # 2 MiB against a 256 KiB receive budget nobody reads
            worker.put(bytes(256 << 10), block=False)
        for client in clients[:4]:
            client.put(bytes(100_000))
        wait_for(lambda: board.snapshot.active_stalls and board.ticks >= 10, 30,
                 message="a wait and 10 samples")
        live = json.loads(json.dumps(board.widget.view))
        board.stop()
        static = board.static_html()
        assert not board.errors
        return live, static
    finally:
        for communicator in communicators:
            communicator.close(timeout=5)


@pytest.mark.timeout(180)
def test_the_live_view_fits_at_760_1000_and_1400_px_with_33_links(views):
    live, static = views
    assert live["live"] and live["state"] == "waiting"
    sync_playwright = _playwright()
    source = (FRONTEND / "dashboard.js").read_text(encoding="utf-8")
    css = (FRONTEND / "dashboard.css").read_text(encoding="utf-8")
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for width in (760, 1000, 1400):  # 760: marimo's default column
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.on("console", lambda message: errors.append(message.text)
                        if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.set_content(PAGE)
                assert page.evaluate(MOUNT, [source, css, live]) == "function"
                shown = page.evaluate(MEASURE)
                assert shown["live"] == "1" and shown["badge"] == "waiting"
                assert shown["scrollWidth"] <= shown["width"] + 1, (width, shown["scrollWidth"])
                assert all(t <= shown["width"] + 1 for t in shown["tables"]), shown["tables"]
                assert shown["sticking"] == 0 and shown["pageOverflow"] <= 0
                assert shown["links"] == len(live["links"]) == 12  # MAX_LINKS, busiest first
                assert shown["others"] >= 1 and f"+{CLIENTS + 1 - 12} more links" in \
                    shown["text"]
                assert shown["linksWithSparkline"] == 2 * shown["links"]
                assert shown["communicators"] == len(live["communicators"])
                assert shown["map"] <= 2 * 10  # MAP_NODES a side
                assert shown["summaries"] and max(shown["summaries"]) < 24  # one line each
                assert shown["height"] < 1500, shown["height"]
                assert not UUID.search(shown["text"])
                page.screenshot(path=str(_artifacts() / f"dashboard-frontend-{width}.png"),
                                full_page=True)

                # a waiting sentence opens on a click and stays open across updates
                page.click("details.netq-stall > summary")
                newer = dict(live, clock="sampled 23:59:59")
                page.evaluate("(view) => window.model.set('view', view)", newer)
                assert page.evaluate(MEASURE)["clock"] == "sampled 23:59:59"
                assert page.evaluate(
                    "() => document.querySelector('details.netq-stall').open") is True
                assert page.evaluate(MEASURE)["scrollWidth"] <= shown["width"] + 1

                # a kernel that goes quiet: the view stops claiming to be live
                page.evaluate("(view) => window.model.set('view', view)",
                              dict(live, stale_after_ms=1200))
                page.wait_for_function(
                    "() => document.querySelector('.netq-dashboard').dataset.live === '0'",
                    timeout=10_000)
                quiet = page.evaluate(MEASURE)
                assert quiet["badge"] == "snapshot"
                assert quiet["snapshot"].startswith(f"snapshot taken {live['taken']}, not live")
                page.evaluate("() => window.cleanup()")
                page.close()

                # the static form, without a script, fits as well
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.set_content(f'<!DOCTYPE html><html><body style="margin:0">'
                                 f'<div id="output" style="padding:0 12px">{static}</div>'
                                 f'</body></html>')
                shown = page.evaluate(MEASURE)
                assert shown["live"] == "0" and shown["badge"] == "stopped"
                assert shown["snapshot"].startswith("snapshot taken ")
                assert shown["scrollWidth"] <= shown["width"] + 1 and shown["sticking"] == 0
                assert shown["pageOverflow"] <= 0 and shown["links"] == 12
                page.close()
        finally:
            browser.close()
    assert not errors, errors


def _artifacts() -> Path:
    folder = Path(os.environ.get("NETQ_TEST_ARTIFACTS",
                                 Path(__file__).resolve().parents[2] / "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
