"""The live views in four real frontends, each a real server on 127.0.0.1, in Debian's chromium.

For JupyterLab, Notebook 7, Voila and marimo, the test writes a notebook (a Jupyter ``.ipynb``,
or a marimo app ``.py``): a server on a free loopback port with clients sending real traffic
from background threads, the server as a cell's last expression (a live monitor),
``server.monitor(names=...)`` and ``netq.widgets.dashboard(...)``. It starts the frontend's
server (browser_testing.py: own config directories, a token where the server has one, this
checkout's netq in the kernel; jupyter_bokeh's lab extension disabled), opens the notebook in
chromium driven by playwright, runs it (Run > Run All Cells in JupyterLab and Notebook 7; Voila
and marimo run it on page load) and checks in the page, against the views' DOM contract:

* the monitors and the dashboard render: title with role, transport and ``127.0.0.1:PORT``,
  one ``tr.netq-peer`` per client by its display name, the charts and legend, the dashboard's
  communicator and link rows (each with a sparkline) and its map;
* they are live: ``data-live="1"``, a badge that is not a static state, and between two
  screenshots taken seconds apart the uptime clock and a chart path change (the pictures too);
  no chart line goes back in time (the page's history holds each sample once, in order);
* jupyter_bokeh is not loaded (JupyterLab and Notebook 7: none of its plugins registered; Voila:
  not among the extensions of its page; nowhere BokehJS);
* nothing is requested from off 127.0.0.1 (the views use no CDN) and the browser console has
  no errors; the only noise ignored is named where it is handled (``_known_noise``,
  ``VOILA_FONT_CSS``).

JupyterLab also: a peer joining while a cell runs appears; a 32-peer monitor fits 1000 x 900
px in an output area at least 1000 px wide and every peer is found by typing its name into the
filter box; after a cell stops the monitor and the dashboard, each output shows the static
form (``data-live="0"``, ``.netq-snapshot``, badge ``stopped``) with the same rows.

The kernel's own history cannot hold duplicates any more (the browser sends no data back,
only a request for the history), so the old kernel-side duplicate check is gone; the path
check above looks at what the page drew.

Screenshots go to ``test-artifacts/`` (``$NETQ_TEST_ARTIFACTS``) as
``browser-<frontend>-*.png``, with ``browser-<frontend>.txt`` (what the page showed, timings)
and, on failure, ``browser-<frontend>-failure.{png,txt}``. Servers and kernels are stopped by
pid even when a check fails. The test skips only when chromium (``/usr/bin/chromium``,
``$NETQ_CHROMIUM``), the playwright package or the frontend's package is missing; CI installs
them (.ci/run, the dev extra). Never ``playwright install``.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from browser_testing import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_FLAGS,
    PLUGINS_JS,
    JupyterLab,
    JupyterNotebook,
    Marimo,
    ServedProcess,
    Voila,
    cell_prompts,
    chromium_missing,
    find_view,
    read_views,
    run_all_cells,
    screenshot_view,
    title_port,
    wait_for_page,
)
from netq.lab.brokers import free_port

NOTEBOOK = "views.ipynb"
MARIMO_APP = "views_app.py"
CLIENTS = ["client-0", "client-1", "client-2"]
JOINING = "client-3"  # JupyterLab: joins while a cell runs
CROWD = [f"peer-{number:02d}" for number in range(1, 33)]  # JupyterLab: the 32-peer monitor
STATIC_STATES = {"snapshot", "stopped", "closed"}
BADGE_STATES = {"open", "connecting", "closing", "waiting", "cannot-connect"} | STATIC_STATES
LIVE_GAP_S = 2.0  # the two screenshots of a live view are at least this many seconds apart
VIEWPORT = {"width": 1600, "height": 1200}  # JupyterLab's output area: wider than 1000 px
FIT = (1000, 900)  # px: the 32-peer monitor's bounding box at most
# Requests that leave 127.0.0.1 are answered here (the views load nothing from a CDN). Voila's
# page template links Font Awesome's stylesheets from jsdelivr; an empty stylesheet stands in
# for them (this machine has no network; the views use no icon font). Any other one fails the
# test.
OFF_MACHINE = re.compile(r"^https?://(?!127\.0\.0\.1[:/])")
VOILA_FONT_CSS = "https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@"

# A server on PORT, three named clients each putting 4 KiB every 10 ms (about 0.4 MiB/s: the
# charts move, the shared machine is spared) from background threads, the server draining its
# queue from another: traffic flows for as long as the kernel lives, whatever the cells do.
# ``names`` (monitor) and ``everyone`` (dashboard) name them.
SETUP = '''\
import os, threading, time
import netq as nq

server = nq.new(purpose=nq.Purpose.SERVER, options=nq.CommunicatorOptions(
    netloc=nq.NetworkLocation(host="127.0.0.1", port={port})))
traffic_stop = threading.Event()
clients, names = [], {{}}
everyone = {{server.id: "server"}}

def add_client(name=None):
    client = nq.new(purpose=nq.Purpose.CLIENT, options=nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port={port})))
    name = name or f"client-{{len(clients)}}"
    names[client.id] = everyone[client.id] = name
    clients.append(client)
    def work():
        payload = bytes(4096)
        while not traffic_stop.is_set():
            try:
                client.put(payload, timeout=1)
            except nq.Full:
                continue
            except nq.NetqError:
                return
            time.sleep(0.01)
    threading.Thread(target=work, daemon=True).start()
    return client

def consume():
    while not traffic_stop.is_set():
        try:
            server.get_many(max_messages=256, timeout=0.1)
        except nq.Empty:
            pass
        except nq.ResourceClosed:
            return

def wait_for_file(path, seconds=240):
    """Block this cell until the test creates ``path`` (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)

threading.Thread(target=consume, daemon=True).start()
for _ in range(3):
    add_client()
'''
SERVER_CELL = "server  # a communicator as the last expression: a live monitor"
MONITOR_CELL = "monitor = server.monitor(names=names)\nmonitor"
DASHBOARD_CELL = ("import netq.widgets\n"
                  "board = netq.widgets.dashboard(interval=0.5, names=everyone)\nboard")
JOIN_CELL = f'add_client("{JOINING}")  # joins while this cell runs\nwait_for_file("joined")'
CROWD_CELL = '''\
crowd = nq.new(purpose=nq.Purpose.SERVER, options=nq.CommunicatorOptions(
    netloc=nq.NetworkLocation(host="127.0.0.1", port={port})))
crowd_names = {{}}
for number in range(1, 33):
    peer = nq.new(purpose=nq.Purpose.CLIENT, options=nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port={port})))
    crowd_names[peer.id] = f"peer-{{number:02d}}"
    clients.append(peer)
crowd_monitor = crowd.monitor(names=crowd_names)
crowd_monitor'''
BUSY_CELL = 'wait_for_file("release")  # the kernel stays busy: the views keep updating'
STOP_CELL = "monitor.stop()\nboard.stop()"
# JupyterLab's notebook, cell by cell (keys of _sources); the other frontends run the first four.
LAB_CELLS = ["setup", "server", "monitor", "dashboard", "join", "crowd", "busy", "stop"]
VIEW_CELLS = LAB_CELLS[:4]


def _sources(port: int, crowd_port: int) -> dict[str, str]:
    return {"setup": SETUP.format(port=port), "server": SERVER_CELL,
            "monitor": MONITOR_CELL, "dashboard": DASHBOARD_CELL, "join": JOIN_CELL,
            "crowd": CROWD_CELL.format(port=crowd_port), "busy": BUSY_CELL,
            "stop": STOP_CELL}


def _write_notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, path)


def _write_marimo_app(path: Path, sources: dict[str, str]) -> None:
    """A marimo app of the four view cells; each cell's last expression is its output."""
    cells = [("", sources["setup"], "add_client, everyone, names, server"),
             ("server", sources["server"], ""),
             ("names, server", sources["monitor"], "monitor"),
             ("everyone", sources["dashboard"], "board")]
    parts = ['import marimo\n\n__generated_with = "0.25.2"\napp = marimo.App(width="full")\n']
    for parameters, source, returns in cells:
        body = textwrap.indent(source.rstrip("\n"), "    ")
        result = f" ({returns},)" if returns else ""
        parts.append(f"\n\n@app.cell\ndef _({parameters}):\n{body}\n    return{result}\n")
    parts.append('\n\nif __name__ == "__main__":\n    app.run()\n')
    path.write_text("".join(parts))


FRONTENDS = {
    # name: (import name, what to install, server factory)
    "jupyterlab": ("jupyterlab", "jupyterlab (the notebooks extra)",
                   lambda root, home: JupyterLab(root, home)),
    "notebook": ("notebook", "notebook==7.6.5 (the dev extra)",
                 lambda root, home: JupyterNotebook(root, home)),
    "voila": ("voila", "voila==0.5.13 (the dev extra)",
              lambda root, home: Voila(root, home, NOTEBOOK)),
    "marimo": ("marimo", "marimo==0.25.2 (the dev extra)",
               lambda root, home: Marimo(root, home, MARIMO_APP)),
}


@pytest.fixture(scope="module")
def chromium():
    """One headless chromium for the module (each test has its own context)."""
    if (missing := chromium_missing()) is not None:
        pytest.skip(missing)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing (pip install -e '.[dev]'; never "
                    "`playwright install`: the test drives Debian's chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


# JupyterLab's run is the longest; under heavy load from other jobs it takes minutes, not seconds
# (timings: docs/widgets.md, "Tests")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("frontend", list(FRONTENDS))
def test_live_views_in_a_real_frontend(frontend, chromium):
    module, install, start = FRONTENDS[frontend]
    if importlib.util.find_spec(module) is None:  # not imported here: marimo opens a log file
        pytest.skip(f"{module} missing: pip install {install}")
    home = Path(tempfile.mkdtemp(prefix=f"nq-{frontend}-"))
    root = home / "root"
    root.mkdir()
    port, crowd_port = free_port(), free_port()
    sources = _sources(port, crowd_port)
    if frontend == "marimo":
        _write_marimo_app(root / MARIMO_APP, sources)
    else:
        _write_notebook(root / NOTEBOOK, [sources[cell] for cell in
                                          (LAB_CELLS if frontend == "jupyterlab"
                                           else VIEW_CELLS)])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ("failure.png", "failure.txt"):  # a previous run's
        (ARTIFACTS / f"browser-{frontend}-{stale}").unlink(missing_ok=True)
    problems: list[str] = []
    report: list[str] = []
    began = time.monotonic()
    server = None
    try:
        server = start(root, home)
        report.append(f"{frontend} server up after {time.monotonic() - began:.1f} s")
        context = chromium.new_context(viewport=VIEWPORT)
        off_machine: list[str] = []
        context.route(OFF_MACHINE, lambda route: _off_machine(route, off_machine))
        try:
            page = context.new_page()
            page.on("console", lambda message: problems.append(
                f"console {message.type}: {message.text}") if message.type == "error" else None)
            page.on("pageerror", lambda error: None if _known_noise(frontend, error)
                    else problems.append(f"page error: {error}"))
            run = Run(frontend, page, server, root, port, crowd_port, report, began)
            try:
                run.exercise()
            except BaseException:
                run.diagnose()
                raise
            unexpected = [url for url in off_machine if not url.startswith(VOILA_FONT_CSS)]
            assert not unexpected, f"{frontend}: the page asked for {unexpected}"
        finally:
            context.close()
    finally:
        if server is not None:
            server.stop()
        report.append(f"total {time.monotonic() - began:.1f} s")
        report.extend(f"browser {problem}" for problem in problems)
        (ARTIFACTS / f"browser-{frontend}.txt").write_text("\n".join(report) + "\n")
        shutil.rmtree(home, ignore_errors=True)
    assert not problems, f"{frontend}: browser console:\n" + "\n".join(problems)


# JavaScript: the lab extensions Voila's page loads (its page config) and whether BokehJS is
# in the page.
VOILA_CONFIG_JS = """() => {
  const data = document.getElementById('jupyter-config-data');
  const config = data == null ? {} : JSON.parse(data.textContent);
  return {extensions: (config.federated_extensions ?? []).map((e) => e.name),
          bokeh: window.Bokeh !== undefined};
}"""


def _known_noise(frontend: str, error) -> bool:
    """Notebook 7.6's page throws this on every load, before any cell runs and with no netq
    output in the notebook (a plain ``1+1`` notebook too): its keyboard-shortcuts plugin reads
    the settings schema of a plugin whose settings have not loaded. Nothing else is noise."""
    return (frontend == "notebook"
            and str(error.message) == "Cannot read properties of undefined (reading 'schema')"
            and "/static/notebook/notebook_core." in (error.stack or ""))


def _summary(view: dict) -> dict:
    """A view as VIEWS_JS read it, without the long path data (for the report)."""
    return {key: value for key, value in view.items() if key not in ("series", "sparklines")}


def _backwards(path: str) -> str | None:
    """Where a chart line's x coordinate goes back from one point to the next (each point is
    a later sample; two samples close in time may round to the same x), or None. ``path``: an
    SVG path of M and L commands."""
    points = re.findall(r"[ML]\s*(-?[\d.]+)[ ,]\s*(-?[\d.]+)", path)
    xs = [float(x) for x, _ in points]
    for index in range(1, len(xs)):
        if xs[index] < xs[index - 1]:
            return f"point {index}: x {xs[index - 1]} then {xs[index]}"
    return None


def _off_machine(route, requested: list[str]) -> None:
    """A request that would leave 127.0.0.1: noted, and answered without the network."""
    url = route.request.url
    requested.append(url)
    if url.startswith(VOILA_FONT_CSS):
        route.fulfill(status=200, content_type="text/css", body="")
    else:
        route.abort()


class Run:
    """One frontend's page: opening and running the notebook, then the checks."""

    def __init__(self, frontend: str, page, server: ServedProcess, root: Path, port: int,
                 crowd_port: int, report: list[str], began: float) -> None:
        self.frontend = frontend
        self.page = page
        self.server = server
        self.root = root
        self.port = port
        self.crowd_port = crowd_port
        self.report = report
        self.began = began

    def note(self, line: str) -> None:
        self.report.append(f"{time.monotonic() - self.began:6.1f} s  {line}")

    def artifact(self, suffix: str) -> Path:
        return ARTIFACTS / f"browser-{self.frontend}-{suffix}"

    # -- the run --------------------------------------------------------------------------

    def exercise(self) -> None:
        page, server = self.page, self.server
        page.goto(server.notebook_url(NOTEBOOK), wait_until="commit", timeout=120_000)
        if self.frontend in ("jupyterlab", "notebook"):
            cells = len(LAB_CELLS) if self.frontend == "jupyterlab" else len(VIEW_CELLS)
            page.locator(".jp-Notebook .jp-Cell").nth(cells - 1).wait_for(timeout=120_000)
            assert isinstance(server, JupyterLab | JupyterNotebook)
            wait_for_page(lambda: server.kernel_states() == ["idle"], 120,
                          "the notebook's kernel to be idle")
            run_all_cells(page, lambda: bool(re.search(r"\[(\*|\d+)\]",
                                                       (cell_prompts(page) or [""])[0])))
            self.note("Run All started")
        clients = list(CLIENTS)
        if self.frontend == "jupyterlab":
            # the join cell runs right after the views' cells: the views may first be seen
            # with the late peer already in them
            self.peer_joins()
            clients.append(JOINING)
            self.crowd()
        else:
            self.wait_rendered(clients, 150)
            self.note("the views rendered")
        self.check_content(clients)
        self.check_live()
        page.screenshot(path=str(self.artifact("page.png")), timeout=60_000)
        self.note("page screenshot taken")
        self.check_no_bokeh()
        self.note("no bokeh")
        if self.frontend == "jupyterlab":
            self.check_stopped(clients)

    def views(self) -> list[dict]:
        return read_views(self.page)

    def the_views(self, clients: list[str]) -> tuple[dict, dict, dict] | None:
        """The server's own monitor (its peers by id), the named monitor and the dashboard,
        once each shows every one of ``clients``; else None."""
        views = self.views()
        named = find_view(views, "monitor", self.port, peer=clients[0])
        plain = next((view for view in views if view["kind"] == "monitor"
                      and title_port(view) == self.port and view is not named), None)
        board = find_view(views, "dashboard")
        if named is None or plain is None or board is None:
            return None
        if sorted(named["peers"]) != sorted(clients) or len(plain["peers"]) != len(clients):
            return None
        if not set(clients) <= set(board["communicators"]):
            return None
        return plain, named, board

    def wait_rendered(self, clients: list[str], timeout: float) -> None:
        wait_for_page(lambda: self.the_views(clients), timeout,
                      f"{self.frontend}: both monitors with rows for {clients} and the dashboard "
                      "with those communicators")

    # -- checks ---------------------------------------------------------------------------

    def check_content(self, clients: list[str]) -> None:
        found = self.the_views(clients)
        assert found is not None, \
            f"{self.frontend}: the views lost their rows: {[_summary(v) for v in self.views()]}"
        plain, named, board = found
        self.note(f"monitor: {_summary(named)}")
        self.note(f"dashboard: {_summary(board)}")
        for view in found:
            assert view["live"] == "1" and view["state"] in BADGE_STATES - STATIC_STATES, \
                f"{self.frontend}: a {view['kind']} that is not live: {_summary(view)}"
        for view in (plain, named):
            title = view["title"] or ""
            assert re.search(r"\bserver\b", title, re.I) and re.search(r"\btcp\b", title, re.I), \
                f"{self.frontend}: title without role and transport: {title!r}"
            assert f"127.0.0.1:{self.port}" in title, f"{self.frontend}: title {title!r}"
        for monitor in (plain, named):
            seen = f"{self.frontend}: {_summary(monitor)}"
            assert monitor["total"] == 1, f"no tr.netq-total: {seen}"
            assert monitor["filter"] == 1, f"no input.netq-filter: {seen}"
            assert monitor["sortable"], f"no th[data-sort]: {seen}"
            assert {"throughput", "queue", "memory"} <= set(monitor["charts"]), \
                f"{self.frontend}: charts {monitor['charts']}"
        assert set(clients) <= set(named["legend"]), \
            f"{self.frontend}: legend {named['legend']} lacks {clients}"
        assert set(clients) <= {peer for peer, _ in named["series"]}, \
            f"{self.frontend}: no plotted series for some of {clients}: {named['series']}"
        assert {"server", *clients} <= set(board["communicators"]), board["communicators"]
        row = board["communicatorRows"]["server"]
        assert re.search(r"\bserver\b", row, re.I) and re.search(r"\btcp\b", row, re.I) \
            and f"127.0.0.1:{self.port}" in row, f"{self.frontend}: the server's row: {row!r}"
        links = {f"server→{client}" for client in clients}
        assert links <= set(board["links"]), \
            f"{self.frontend}: dashboard links {board['links']} lack {links}"
        assert min(board["linkSparklines"]) >= 1, \
            f"{self.frontend}: a link row without its sparkline: {_summary(board)}"
        assert board["map"] == 1, f"{self.frontend}: no svg.netq-map: {_summary(board)}"

    def check_live(self) -> None:
        """The named monitor and the dashboard change between two screenshots taken
        ``LIVE_GAP_S`` or more apart: their uptime clocks, a chart's path, the pictures."""
        for kind, peer in (("monitor", CLIENTS[0]), ("dashboard", None)):
            def current(kind=kind, peer=peer) -> dict | None:
                return find_view(self.views(), kind, None if kind == "dashboard" else self.port,
                                 peer=peer)

            first = current()
            assert first is not None, f"{self.frontend}: the {kind} vanished"
            assert first["live"] == "1", f"{self.frontend}: live {kind} has {first['live']=}"
            assert first["state"] in BADGE_STATES - STATIC_STATES, \
                f"{self.frontend}: live {kind}'s badge is {first['state']!r}"
            before = self.artifact(f"{kind}-1.png")
            _, first_picture = screenshot_view(self.page, first["index"], before)
            taken = time.monotonic()

            figures = "series" if kind == "monitor" else "sparklines"

            def changed(first=first, taken=taken, current=current,
                        figures=figures) -> dict | None:
                now = current()
                if now is None or time.monotonic() - taken < LIVE_GAP_S:
                    return None
                return now if (now["uptime"] != first["uptime"]
                               and now[figures] != first[figures]) else None

            now = wait_for_page(changed, 60, f"{self.frontend}: the {kind}'s uptime clock and "
                                "a chart path to change")
            after = self.artifact(f"{kind}-2.png")
            _, picture = screenshot_view(self.page, now["index"], after)
            assert now["live"] == "1" and now["state"] in BADGE_STATES - STATIC_STATES, now
            assert picture != first_picture, \
                f"{self.frontend}: {before.name} and {after.name} are the same picture"
            for peer, path in now["series"]:  # the history the page holds, drawn once
                backwards = _backwards(path)
                assert backwards is None, f"{self.frontend}: {peer}'s line goes back in time " \
                    f"at {backwards} (old points appended again?): {path[:400]}"
            self.note(f"{kind} live: uptime {first['uptime']!r} -> {now['uptime']!r}")

    def check_no_bokeh(self) -> None:
        """No BokehJS in the page; in JupyterLab and Notebook 7 jupyter_bokeh's lab extension
        is disabled: none of its plugins is registered (the widget manager's are active, so the
        check can tell); Voila's page does not list it among the extensions it loads."""
        if self.frontend == "marimo":
            assert not self.page.evaluate("() => window.Bokeh !== undefined"), "BokehJS loaded"
            return
        if self.frontend == "voila":
            config = self.page.evaluate(VOILA_CONFIG_JS)
            assert config["extensions"], f"no lab extensions in voila's page config: {config}"
            assert not [name for name in config["extensions"] if "bokeh" in name], config
            assert not config["bokeh"], "voila: BokehJS is loaded in the page"
            return
        plugins = self.page.evaluate(PLUGINS_JS)
        assert plugins is not None, f"{self.frontend}: window.jupyterapp is not exposed"
        assert any(p.startswith("@jupyter-widgets/jupyterlab-manager")
                   for p in plugins["plugins"]), plugins["plugins"]
        assert not [p for p in plugins["registered"] if "bokeh" in p.lower()], \
            f"{self.frontend}: jupyter_bokeh's plugins are registered: {plugins['registered']}"
        assert not plugins["bokeh"], f"{self.frontend}: BokehJS is loaded in the page"

    # -- JupyterLab only ------------------------------------------------------------------

    def prompt(self, cell: str) -> str:
        return cell_prompts(self.page)[LAB_CELLS.index(cell)]

    def peer_joins(self) -> None:
        """A client joins while the join cell runs: both monitors and the dashboard show it
        before that cell ends (it waits for the test)."""
        wait_for_page(lambda: "*" in self.prompt("join"), 150, "the join cell to run")
        self.wait_rendered([*CLIENTS, JOINING], 90)
        assert "*" in self.prompt("join"), "the join cell ended before the peer showed"
        self.note(f"{JOINING} appeared while its cell ran")
        (self.root / "joined").touch()

    def crowd(self) -> None:
        """The 32-peer monitor fits 1000 x 900 px in an output area at least 1000 px wide,
        and typing each peer's name into its filter box leaves that peer's row shown."""
        def crowd_view() -> dict | None:
            view = find_view(self.views(), "monitor", self.crowd_port)
            if view is None or "*" not in self.prompt("busy"):
                return None
            every = set(view["peers"]) == set(CROWD) or (
                view["others"] and re.search(rf"\b{len(CROWD)} peers\b", view["title"] or ""))
            return view if every else None

        view = wait_for_page(crowd_view, 120, "the 32-peer monitor with every peer (rows, or "
                             "rows and a folded row), while the busy cell runs")
        box, _ = screenshot_view(self.page, view["index"], self.artifact("crowd.png"))
        self.note(f"32-peer monitor: {box}, rows {len(view['peers'])}, "
                  f"folded {view['others']}")
        assert box["area"] is not None and box["area"] >= FIT[0], \
            f"the crowd's output area is {box['area']} px wide, not >= {FIT[0]}"
        assert box["width"] <= FIT[0] and box["height"] <= FIT[1], \
            f"the 32-peer monitor is {box['width']:.0f} x {box['height']:.0f} px, not within " \
            f"{FIT[0]} x {FIT[1]}"
        drawn = box["drawn"]
        assert drawn["width"] <= FIT[0] and drawn["height"] <= FIT[1], \
            f"the 32-peer monitor draws {drawn['width']:.0f} x {drawn['height']:.0f} px (its " \
            f"box: {box['width']:.0f} x {box['height']:.0f}), not within {FIT[0]} x {FIT[1]}"
        monitor = self.page.locator("div.netq-monitor").filter(
            has_text=f"127.0.0.1:{self.crowd_port}")
        search = monitor.locator("input.netq-filter")
        for name in CROWD:
            search.fill("", timeout=30_000)
            search.press_sequentially(name, timeout=30_000)  # key by key, as a person types

            def found(name=name) -> bool:
                shown = find_view(self.views(), "monitor", self.crowd_port)
                return (shown is not None and shown["shownPeers"] == [name]
                        and shown["seenPeers"] == [name])

            wait_for_page(found, 30, f"only {name}'s row shown (and in sight, not scrolled "
                          "away) after typing it in the filter")
        search.fill("", timeout=30_000)
        wait_for_page(lambda: len((find_view(self.views(), "monitor", self.crowd_port) or
                                   {"shownPeers": []})["shownPeers"]) > 1, 30,
                      "the crowd's rows back after clearing the filter")
        self.note("every crowd peer found through the filter")

    def check_stopped(self, clients: list[str]) -> None:
        """After the stop cell, the monitor's and the dashboard's outputs are static forms,
        with the rows they showed."""
        (self.root / "release").touch()
        wait_for_page(lambda: re.search(r"\[\d+\]", self.prompt("stop")), 120,
                      "the stop cell to run")
        self.note("the stop cell ran")
        cells = self.page.locator(".jp-Cell")
        for cell, kind in (("monitor", "monitor"), ("dashboard", "dashboard")):
            output = cells.nth(LAB_CELLS.index(cell))

            def static(output=output, kind=kind) -> dict | None:
                views = read_views(output)
                return views[0] if (len(views) == 1 and views[0]["kind"] == kind
                                    and views[0]["live"] == "0") else None

            view = wait_for_page(static, 60, f"the stopped {kind}'s static form")
            assert view["state"] == "stopped", f"stopped {kind}'s badge: {view['state']!r}"
            assert view["snapshot"] and "snapshot" in view["snapshot"].lower(), \
                f"stopped {kind} without its .netq-snapshot sentence: {view}"
            if kind == "monitor":
                assert sorted(view["peers"]) == sorted(clients), f"stopped monitor: {view}"
            else:
                assert {f"server→{client}" for client in clients} <= set(view["links"]), \
                    f"stopped dashboard: {view}"
            index = next(v["index"] for v in self.views() if v["title"] == view["title"]
                         and v["live"] == "0")
            screenshot_view(self.page, index, self.artifact(f"{kind}-stopped.png"))
            self.note(f"stopped {kind}: {view['snapshot']!r}")

    # -- failure --------------------------------------------------------------------------

    def diagnose(self) -> None:
        """On failure: a screenshot, the views as the page shows them, the server log."""
        try:
            self.page.screenshot(path=str(self.artifact("failure.png")), timeout=60_000)
        except Exception as error:  # noqa: BLE001 - diagnostics must not hide the failure
            self.note(f"failure screenshot failed: {error!r}")
        try:
            views = self.views()
            prompts = cell_prompts(self.page)
            body = self.page.locator("body").inner_text(timeout=10_000)[-4000:]
        except Exception as error:  # noqa: BLE001 - diagnostics must not hide the failure
            views, prompts, body = [], [], f"page unreadable: {error!r}"
        self.artifact("failure.txt").write_text(
            f"prompts: {prompts}\nviews: {views}\npage text (end): {body}\n"
            f"{self.frontend} log:\n{self.server.log()}\n")


# ------------------------------------------------------------------ static forms in a page

CROWD_SIZE = 32
STALL_S = 0.5  # seconds a full share waits before statistics() says why (stall_warning)


@pytest.mark.timeout(120)
def test_static_forms_keep_the_waiting_crowd_and_the_links(chromium):
    """What the docs site shows of a notebook's views: the static forms a monitor and a
    dashboard leave once their communicators closed, opened in chromium. A server whose 32
    clients each filled their share of its receive budget (every row waiting, and why),
    then closed: the monitor's static form still shows the 32 rows and the wait's reason,
    the dashboard's its 32 links, both dated and neither live."""
    import gc

    from netq.widgets import dashboard

    import netq as nq

    gc.collect()  # communicators earlier tests left unreferenced: not on this dashboard
    kib = 1024
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", 0),
        connection=nq.ConnectionOptions(recv_budget=CROWD_SIZE * 64 * kib,
                                        stall_warning=STALL_S)))
    clients = []
    names = {}
    for number in range(1, CROWD_SIZE + 1):
        options = nq.CommunicatorOptions(
            netloc=nq.NetworkLocation("127.0.0.1", server.address[1]),
            connection=nq.ConnectionOptions(send_budget=128 * kib, stall_warning=STALL_S))
        names[options.id] = f"peer-{number:02d}"
        clients.append(nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, options))
    monitor = server.monitor(interval=0.1, names=names, start=True)
    board = dashboard(interval=0.1, names={server.id: "server", **names},
                      max_links=CROWD_SIZE, start=True)
    try:
        wait_for_page(lambda: len(server.peers) == CROWD_SIZE, 30, "32 connected clients")
        payload = bytes(16 * kib)
        for client in clients:  # nobody takes: each share fills, then put() would block
            while True:
                try:
                    client.put(payload, block=False)
                except nq.Full:
                    break

        def every_row_waits() -> bool:
            view = monitor.widget.view
            return (view["title"]["state"] == "waiting" and len(view["rows"]) == CROWD_SIZE
                    and all(row["blocked"] for row in view["rows"])
                    and len(board.snapshot.links) == CROWD_SIZE)

        wait_for_page(every_row_waits, 60, "32 waiting rows in the monitor, 32 links")
    finally:
        def drain() -> None:  # what the clients sent is taken: their close() is not held up
            while True:
                try:
                    server.get_many(max_messages=256, timeout=0.1)
                except nq.Empty:
                    continue
                except nq.ResourceClosed:
                    return

        drainer = threading.Thread(target=drain, name="test-drain", daemon=True)
        drainer.start()
        for client in clients:
            client.close(timeout=10)
        server.close(timeout=10)
        drainer.join(10)
    wait_for_page(lambda: not monitor.running and not board.running, 30,
                  "both views to end with their communicators")
    monitor_form, board_form = monitor.static_html(), board.static_html()
    context = chromium.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_content(f"<!DOCTYPE html><html><body>{monitor_form}{board_form}</body></html>")
        views = read_views(page)
        (shown,) = [view for view in views if view["kind"] == "monitor"]
        (links,) = [view for view in views if view["kind"] == "dashboard"]
        waits = page.locator(".netq-monitor ul.netq-waiting li").all_inner_texts()
        page.screenshot(path=str(ARTIFACTS / "browser-static-forms.png"), full_page=True)
    finally:
        context.close()
    assert shown["live"] == "0" and shown["state"] == "closed", shown
    assert shown["snapshot"].startswith("snapshot taken ") and "closed after it" in shown[
        "snapshot"], shown["snapshot"]
    max_rows = monitor.table.max_rows or CROWD_SIZE
    assert len(shown["peers"]) == min(CROWD_SIZE, max_rows), shown["peers"]
    assert shown["others"] == (1 if max_rows < CROWD_SIZE else 0)
    assert re.search(rf"\b{CROWD_SIZE} peers\b", shown["title"]), shown["title"]
    assert len(shown["legend"]) > 0 and shown["series"], "the charts as they were"
    assert len(waits) == CROWD_SIZE, waits[:3]
    assert all("waits for credit from recv_budget" in text for text in waits), waits[:3]
    assert links["live"] == "0" and links["state"] == "closed", links
    assert {f"server→{name}" for name in names.values()} == set(links["links"]), links["links"]
    assert all(count > 0 for count in links["linkSparklines"])
