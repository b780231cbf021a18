"""The widget in a real browser: JupyterLab + Debian's chromium driven by playwright.

The test writes a notebook (a server and clients on 127.0.0.1 with real traffic, the server
displayed as a cell's last expression, then ``server.monitor()``, then a cell that adds a
client and keeps the kernel busy), starts ``jupyter-lab`` on a free loopback port with a token
and its own config/data/runtime/settings directories, opens the notebook with ``?reset``,
runs all cells from the menu and checks in the page: both monitors render their table (one
row per peer, the late peer included) and their bokeh canvases, the points plotted grow (also
while the last cell keeps the kernel busy), and the console has no errors. It re-runs the
check cell once the kernel is idle (when the browser's echoes have arrived) to see that the
kernel-side data has no duplicates.
Screenshots go to ``test-artifacts/`` (``$NETQ_TEST_ARTIFACTS``). Kernels are deleted and
the server is stopped by its pid.

It skips only when chromium (``/usr/bin/chromium``, ``$NETQ_CHROMIUM``) or the playwright
package is missing; CI installs both (.ci/run, the dev extra). Never ``playwright install``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from netq.brokers import free_port
from netq_testing import wait_for

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("NETQ_TEST_ARTIFACTS", REPO / "test-artifacts"))
CHROMIUM = os.environ.get("NETQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"]
NOTEBOOK = "monitor.ipynb"
WORKSPACE = "netq-widgets-test"

SETUP = '''\
import threading, time
import netq as nq

server = nq.new(purpose=nq.Purpose.SERVER, options=nq.CommunicatorOptions(
    netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
port = server.address[1]
stop = threading.Event()
clients, names = [], {}

def add_client():
    client = nq.new(purpose=nq.Purpose.CLIENT, options=nq.CommunicatorOptions(
        netloc=nq.NetworkLocation(host="127.0.0.1", port=port)))
    names[client.id] = f"client-{len(clients)}"
    clients.append(client)
    def work():
        payload = bytes(16384)
        while not stop.is_set():
            try:
                client.put(payload, timeout=1)
            except nq.Full:
                continue
            except nq.NetqError:
                return
            time.sleep(0.004)
    threading.Thread(target=work, daemon=True).start()

def consume():
    while not stop.is_set():
        try:
            server.get_many(max_messages=256, timeout=0.1)
        except nq.Empty:
            pass
        except nq.ResourceClosed:
            return

threading.Thread(target=consume, daemon=True).start()
for _ in range(3):
    add_client()
time.sleep(1)  # traffic under way before the monitors open; the test polls what it checks
'''
CELLS = [
    SETUP,
    "# NBVAL_IGNORE_OUTPUT\nserver  # a communicator as the last expression: a live monitor",
    "# NBVAL_IGNORE_OUTPUT\nmonitor = server.monitor(names=names)\nmonitor",
    ("# NBVAL_IGNORE_OUTPUT\nimport netq.widgets\n"
     "board = netq.widgets.dashboard(interval=0.5, names={server.id: 'server', **names})\n"
     "board"),
    "add_client()  # a peer joins while this cell keeps the kernel busy\ntime.sleep(6)",
    ('t = monitor.plots.source.data["t"]\n'
     'sampler = monitor.sampler or sampler  # kept from the first run (stopped by now)\n'
     'print(f"netq-check points={len(t)} unique={len(set(t))} '
     'echoes={monitor.bokeh.ignored_echoes} peers={len(monitor.stats.peers)} '
     'ticks={monitor.plots.ticks} refreshes={monitor.bokeh.refreshes} '
     'cpu_s={sampler.cpu_seconds:.3f} cpu={100 * sampler.cpu_fraction():.3f}%")\n'
     'assert len(t) == len(set(t))'),
    ("import os  # the kernel stays busy until the test releases it: the monitors keep updating\n"
     "deadline = time.monotonic() + 180\n"
     "while not os.path.exists(\"release\") and time.monotonic() < deadline:\n"
     "    time.sleep(0.1)"),
    # then the views stop: the monitor and the dashboard give way to their static forms
    "monitor.stop()\nboard.stop()",
]
CHECK_CELL, BUSY_CELL = 5, 6

# JavaScript: the number of points in each bokeh ColumnDataSource with a "t" column.
POINTS_JS = """() => {
  const B = window.Bokeh;
  if (B == null || B.documents == null) return null;
  const counts = {};  // source id -> points (the largest, if stale documents linger)
  for (const doc of B.documents) {
    const models = doc._all_models != null ? doc._all_models.values() : doc.all_models;
    for (const model of models) {
      const data = model.data;  // a Map in BokehJS 3.9, a plain object in older versions
      if (data == null || typeof data !== "object") continue;
      const t = data instanceof Map ? data.get("t") : data.t;
      if (t != null && typeof t.length === "number")
        counts[model.id] = Math.max(counts[model.id] ?? 0, t.length);
    }
  }
  return counts;
}"""


def _requirements():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"chromium not found at {CHROMIUM} (Debian: apt-get install chromium; "
                    ".ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing (pip install -e '.[dev]')")
    import jupyterlab  # noqa: F401 - required (dev extra): a failure, not a skip
    import nbformat
    return sync_playwright, nbformat


class Lab:
    """jupyter-lab in its own directories, on 127.0.0.1, stopped by pid."""

    def __init__(self, root: Path, home: Path) -> None:
        self.token = secrets.token_hex(16)
        self.root = root
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        kernels = home / "jupyter-path" / "kernels" / "python3"
        kernels.mkdir(parents=True)
        # The kernel is this interpreter, importing this checkout's netq first.
        (kernels / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (netq test)", "language": "python",
            "env": {"PYTHONPATH": self._pythonpath()}}))
        settings = home / "settings"
        for plugin, values in {
            "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
                {"windowingMode": "none"},  # every cell attached: both monitors render
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False},
        }.items():
            path = settings / plugin
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(os.environ)
        data_paths = [str(home / "jupyter-path")]
        for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):  # lab extensions
            data_paths.append(os.path.join(prefix, "share", "jupyter"))
        # Server extensions (jupyter_lsp, terminals) are enabled in <prefix>/etc/jupyter; a
        # venv with system site packages would not see its base interpreter's.
        config_paths = [os.path.join(prefix, "etc", "jupyter")
                        for prefix in dict.fromkeys([sys.prefix, sys.base_prefix])]
        env.update({
            "JUPYTER_PATH": os.pathsep.join(data_paths),
            "JUPYTER_CONFIG_PATH": os.pathsep.join(config_paths),
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "IPYTHONDIR": str(home / "ipython"),
            "PYTHONPATH": self._pythonpath(),
        })
        self.log_path = home / "jupyter-lab.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={root}",
             f"--LabApp.user_settings_dir={settings}",
             f"--LabApp.workspaces_dir={home / 'workspaces'}"]
            + (["--allow-root"] if os.geteuid() == 0 else []),
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            cwd=root)
        try:
            self._wait_ready(90)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _pythonpath() -> str:
        extra = os.environ.get("PYTHONPATH")
        return os.pathsep.join([str(REPO)] + ([extra] if extra else []))

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # a bounded poll of the server's status API
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter-lab exited ({self.proc.returncode}):\n{self.log()}")
            try:
                self.api("/api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.25)
        raise RuntimeError(f"jupyter-lab not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                for kernel in self.api("/api/kernels"):
                    self.api(f"/api/kernels/{kernel['id']}", method="DELETE")
        except (urllib.error.URLError, OSError):
            pass
        finally:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
            self._log.close()


def _points(page) -> dict[str, int]:
    return page.evaluate(POINTS_JS) or {}


def _both_grew(before: dict[str, int], now: dict[str, int]) -> bool:
    """Both monitors' time series have more points than ``before``: the two largest sources
    compared by size, not by model id (a peer joining may re-send a plot as new models)."""
    if len(before) < 2 or len(now) < 2:
        return False
    old, new = sorted(before.values())[-2:], sorted(now.values())[-2:]
    return new[0] > old[0] and new[1] > old[1]


def _run_all(page) -> None:
    """Run > Run All Cells; again if the first cell has not started within 30 s."""
    first = page.locator(".jp-Cell").first.locator(".jp-InputPrompt")
    for _ in range(2):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(
            no_wait_after=True, timeout=120_000)
        page.locator('li.lm-Menu-item[data-command="runmenu:run-all"]').click(
            no_wait_after=True, timeout=120_000)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if re.search(r"\[(\*|\d+)\]", first.inner_text()):
                return
            time.sleep(0.25)
    raise AssertionError("Run All did not start the first cell")


@pytest.mark.timeout(600)  # a loaded 2-core CI machine renders slowly
def test_monitor_in_jupyterlab_with_chromium():
    sync_playwright, nbformat = _requirements()
    home = Path(tempfile.mkdtemp(prefix="nq-lab-"))
    root = home / "root"
    root.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, root / NOTEBOOK)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    lab = Lab(root, home)
    problems: list[str] = []
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(home / "chromium-profile"), executable_path=CHROMIUM, headless=True,
                args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1800})
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                        if m.type == "error" else None)
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                try:
                    _exercise(page, lab)
                except BaseException:
                    _diagnose(page, lab)
                    raise
            finally:
                context.close()
    finally:
        lab.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert not problems, "browser console:\n" + "\n".join(problems)


TABLES_JS = """() => [...document.querySelectorAll('.netq-monitor .netq-table')].map(
  (table) => [...table.querySelectorAll('tr.peer')].map((row) => row.innerText))"""


# The monitors' title rows, as text (textContent: the badge's CSS upper-casing aside).
TITLES_JS = """() => [...document.querySelectorAll('.netq-monitor .netq-title')].map(
  (title) => [...title.children].map((part) => part.textContent.trim()).join(' '))"""
# The live dashboard: its text, link rows and whether its map is drawn.
DASHBOARD_JS = """() => {
  const board = document.querySelector('.netq-dashboard');
  if (board == null) return null;
  return {text: board.textContent, links: board.querySelectorAll('tr.link').length,
          map: board.querySelector('svg.netq-map line') != null};
}"""


# A monitor's shared legend as drawn: for each plotted peer's colour in its table (the
# swatch before the name), how many pixels of exactly that colour the legend strip's canvas
# (the monitor's short canvas, inside bokeh's shadow roots) has.
LEGEND_JS = """(monitor) => {
  const hex = (r, g, b) => '#' + [r, g, b].map((v) => v.toString(16).padStart(2, '0')).join('');
  const counts = {};
  for (const swatch of monitor.querySelectorAll('.netq-table .netq-swatch')) {
    const [r, g, b] = getComputedStyle(swatch).backgroundColor.match(/\\d+/g).map(Number);
    counts[hex(r, g, b)] = 0;
  }
  const canvases = [];
  const walk = (root) => {
    for (const element of root.querySelectorAll('*')) {
      if (element.tagName === 'CANVAS') canvases.push(element);
      if (element.shadowRoot) walk(element.shadowRoot);
    }
  };
  walk(monitor);
  const strips = canvases.filter((c) => c.clientHeight > 0 && c.clientHeight <= 40);
  for (const canvas of strips) {
    const context = canvas.getContext('2d');
    if (context == null || canvas.width === 0) continue;
    const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < data.length; i += 4) {
      const colour = hex(data[i], data[i + 1], data[i + 2]);
      if (data[i + 3] === 255 && colour in counts) counts[colour] += 1;
    }
  }
  return {strips: strips.length, counts};
}"""


# Where a monitor's legend strip is on the page (its short canvas), and the names of the
# plotted lines the browser has hidden (a tap on a legend entry hides that peer's lines).
STRIP_BOX_JS = """(monitor) => {
  const walk = (root) => {
    for (const element of root.querySelectorAll('*')) {
      if (element.tagName === 'CANVAS' && element.clientHeight > 0 && element.clientHeight <= 40)
        return element;
      const found = element.shadowRoot ? walk(element.shadowRoot) : null;
      if (found) return found;
    }
    return null;
  };
  const strip = walk(monitor);
  if (strip == null) return null;
  const box = strip.getBoundingClientRect();
  return {x: box.x, y: box.y, width: box.width, height: box.height};
}"""
HIDDEN_LINES_JS = """() => {
  const hidden = new Set();
  for (const doc of window.Bokeh.documents) {
    const models = doc._all_models != null ? doc._all_models.values() : doc.all_models;
    for (const model of models)
      if (typeof model.name === 'string' && model.visible === false
          && /-(mb_in|mb_out|queue_in|queue_out|memory)$/.test(model.name))
        hidden.add(model.name);
  }
  return [...hidden];
}"""


def _legend_swatches(monitor) -> dict | None:
    """The legend strip's pixels per table colour, once every colour is drawn (else None)."""
    legend = monitor.evaluate(LEGEND_JS)
    counts = legend["counts"]
    return legend if len(counts) == 4 and min(counts.values()) >= 30 else None


def _tables(page) -> list[list[str]]:
    """Rows of every monitor table, read in one go (the tables are replaced at 2 Hz)."""
    return page.evaluate(TABLES_JS)


def _exercise(page, lab: Lab) -> None:
    page.goto(f"{lab.url}/lab/workspaces/{WORKSPACE}/tree/{NOTEBOOK}?reset&token={lab.token}")
    page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1).wait_for(timeout=90_000)
    page.get_by_text("Kernel status: Idle").first.wait_for(state="attached", timeout=90_000)
    _run_all(page)
    start = time.monotonic()
    # both monitors: a table with a row per peer, and bokeh canvases (inside shadow roots,
    # which playwright's CSS selectors pierce)
    wait_for_page(lambda: len(_tables(page)) == 2 and all(len(t) >= 3 for t in _tables(page)),
              240, "both monitors' tables with 3 peers")
    wait_for_page(lambda: page.locator(".netq-monitor canvas").count() >= 6, 60,
              "bokeh canvases in both monitors")
    counts = wait_for_page(lambda: (lambda c: len(c) >= 2 and min(c.values()) >= 2 and c)(
        _points(page)), 60, "points in both monitors' plots")
    # the late peer (cell 4, while the kernel is busy) shows up in both tables, and the
    # plots keep growing while that cell runs
    wait_for_page(lambda: all(len(t) == 4 for t in _tables(page)), 60, "4 peers in both tables")
    later = wait_for_page(lambda: (lambda c: _both_grew(counts, c) and c)(_points(page)), 180,
                          "both plots growing")
    # while the last cell keeps the kernel busy, the plots still grow
    busy = page.locator(".jp-Cell").nth(BUSY_CELL).locator(".jp-InputPrompt")
    wait_for_page(lambda: "*" in busy.inner_text(), 90, "the busy cell to start")
    during = _points(page)
    grown = wait_for_page(lambda: (lambda c: _both_grew(during, c) and c)(_points(page)), 60,
                          "both plots growing while busy")
    assert "*" in busy.inner_text(), "the busy cell ended before the plots grew"
    tables = _tables(page)
    titles = page.evaluate(TITLES_JS)
    assert len(titles) == 2 and all(t.startswith("netq TCP server 127.0.0.1:") for t in titles), \
        titles
    assert all("open" in t and "up " in t and "4 peers" in t and "('" not in t
               for t in titles), titles
    board = wait_for_page(lambda: (lambda b: b and b["links"] >= 4 and b)(
        page.evaluate(DASHBOARD_JS)), 60, "the dashboard with 4 links")
    assert board["map"] and "server → client-0" in board["text"], board
    assert all("connected" in row for row in tables[0]), tables
    assert any("client-3" in row for row in tables[1]), tables
    # the shared legend above the plots draws one swatch per peer, in the colour the table
    # shows before that peer's name (which is the colour of its lines)
    for index in range(2):
        monitor = page.locator(".netq-monitor").nth(index)
        wait_for_page(lambda m=monitor: _legend_swatches(m), 60,
                      f"monitor {index}'s legend: a swatch in each table colour")
    page.screenshot(path=str(ARTIFACTS / "widgets-jupyterlab.png"), timeout=120_000)
    for index, name in ((0, "widgets-monitor.png"), (1, "widgets-monitor-2.png"),
                        (0, "widgets-dashboard.png")):
        monitor = page.locator(".netq-dashboard" if "dashboard" in name
                               else ".netq-monitor").nth(index)
        monitor.evaluate("(element) => element.scrollIntoView()")
        box = monitor.bounding_box()  # (an element screenshot would wait for a still element)
        if box is not None:
            page.screenshot(path=str(ARTIFACTS / name), clip=box, timeout=120_000)
    # a tap on the first legend entry (its swatch) hides that peer's five lines; another
    # shows them again
    monitor = page.locator(".netq-monitor").nth(1)
    monitor.evaluate("(element) => element.scrollIntoView()")
    clicked = -math.inf
    for hidden in (5, 0):
        strip = monitor.evaluate(STRIP_BOX_JS)
        # bokeh takes two taps within 300 ms for a double tap (not a tap): keep them apart
        time.sleep(max(0.0, clicked + 0.4 - time.monotonic()))
        page.mouse.click(strip["x"] + 13, strip["y"] + strip["height"] / 2)
        clicked = time.monotonic()
        lines = wait_for_page(lambda n=hidden: (lambda h: len(h) == n and (h or ["none"]))(
            page.evaluate(HIDDEN_LINES_JS)), 30, f"{hidden} lines hidden by the legend")
        assert len({name.rsplit("-", 1)[0] for name in lines}) == 1, lines  # one peer's
    # the busy cell may end now; the stop cell after it replaces the live views
    (lab.root / "release").touch()
    # once Run All is done and the kernel idle, the browser's echoes have reached the kernel:
    # run the check cell again and read what it printed
    cell = page.locator(".jp-Cell").nth(CHECK_CELL)
    wait_for_page(lambda: "netq-check" in _output(cell), 90, "the check cell's output")
    wait_for_page(lambda: "*" not in busy.inner_text(), 60, "the busy cell to end")
    page.get_by_text("Kernel status: Idle").first.wait_for(state="attached", timeout=90_000)
    # A click in JupyterLab never navigates: do not wait for navigations after it (a loaded
    # machine kept playwright waiting for "scheduled navigations" past its 30 s timeout).
    cell.locator(".jp-InputArea-editor").click(no_wait_after=True, timeout=120_000)
    page.keyboard.press("Shift+Enter")
    text = wait_for_page(lambda: _check_line(cell, after=1), 60, "the re-run check cell")
    final = _points(page)
    # the stop cell ran after the busy one: the stopped monitor and dashboard show their
    # static forms (title badge "stopped"; the dashboard's map and links, without a script)
    wait_for_page(lambda: page.locator(".netq-state-stopped").count() >= 2, 60,
                  "the stopped monitor's and dashboard's static forms")
    stopped = page.locator(".netq-state-stopped").first.locator("xpath=../..")
    stopped.evaluate("(element) => element.scrollIntoView()")
    box = stopped.bounding_box()
    if box is not None:
        page.screenshot(path=str(ARTIFACTS / "widgets-stopped.png"), clip=box, timeout=120_000)
    numbers = dict(re.findall(r"(\w+)=([0-9.]+)", text))
    (ARTIFACTS / "widgets-jupyterlab.txt").write_text(
        f"{text}\nbrowser points per source: {counts} -> {later}; while a cell ran: "
        f"{during} -> {grown}; at the end: {final}\n"
        f"seconds from Run All to the end of the checks: {time.monotonic() - start:.1f}\n")
    assert int(numbers["points"]) == int(numbers["unique"]) > 10, text
    assert int(numbers["echoes"]) > 0, text  # the browser did echo, and it was ignored
    assert int(numbers["peers"]) == 4, text


def _diagnose(page, lab: Lab) -> None:
    """On failure: a screenshot, the page's view of the monitors and the server log."""
    try:
        page.screenshot(path=str(ARTIFACTS / "widgets-failure.png"), timeout=60_000)
        prompts = page.locator(".jp-Cell .jp-InputPrompt").all_inner_texts()
        (ARTIFACTS / "widgets-failure.txt").write_text(
            f"prompts: {prompts}\ntables: {_tables(page)}\npoints: {_points(page)}\n"
            f"outputs: {[_output(c) for c in page.locator('.jp-Cell').all()]}\n"
            f"jupyter-lab log:\n{lab.log()}\n")
    except Exception as error:  # noqa: BLE001 - diagnostics must not hide the failure
        (ARTIFACTS / "widgets-failure.txt").write_text(f"diagnostics failed: {error!r}\n")


def _check_line(cell, after: int) -> str | None:
    prompt = cell.locator(".jp-InputPrompt").inner_text()
    count = re.search(r"\[(\d+)\]", prompt)
    if count is None or int(count.group(1)) <= len(CELLS):  # not the re-run yet
        return None
    match = re.search(r"netq-check [^\n]*", _output(cell))
    return match.group(0) if match else None


def wait_for_page(predicate, timeout: float, what: str):
    """The page changes at human speed: poll it four times a second."""
    return wait_for(predicate, timeout, 0.25, what)


def _output(cell) -> str:
    outputs = cell.locator(".jp-OutputArea-output")
    return "\n".join(outputs.all_inner_texts()) if outputs.count() else ""
