"""Real frontends for tests/widgets/test_browser.py: their servers, and what a page shows.

Each frontend (JupyterLab, Notebook 7, Voila, marimo) is a real server on 127.0.0.1 and a free
port (``netq.lab.brokers.free_port``), started with this interpreter in its own session, with its
own config/data/runtime directories and a log file, and stopped by its pid (its kernels
deleted first where the server has a kernels API, then any process it started that outlived
it, by pid). The kernels are this interpreter importing this checkout's netq first.

The page side reads the shared DOM contract of netq's live views (``div.netq-view``: title,
badge, uptime clock, peers table, charts, the dashboard's rows and map) with one JavaScript
function that also looks inside shadow roots (marimo renders widgets in them).
"""

from __future__ import annotations

import abc
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from netq.lab.brokers import free_port
from netq_testing import wait_for

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("NETQ_TEST_ARTIFACTS", REPO / "test-artifacts"))
CHROMIUM = os.environ.get("NETQ_CHROMIUM", "/usr/bin/chromium")


def chromium_missing() -> str | None:
    """Why no chromium can be launched here (None when one can): the skip reason names what
    to install."""
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return None
    return (f"no chromium executable at {CHROMIUM}: install Debian's with `sudo apt-get install "
            f"-y chromium` (.ci/run does), or set $NETQ_CHROMIUM to a Chromium executable")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"]
# The lab extension jupyter_bokeh installs (the old bokeh-based views needed it): the new
# views must render without it, so the Jupyter frontends run with it disabled.
BOKEH_EXTENSION = "@bokeh/jupyter_bokeh"
SERVER_START_S = 90  # seconds a server gets to answer: seconds idle, tens of them when loaded
# jupyter_server refuses to run as root without it (CI containers); voila has no such check
ALLOW_ROOT = ["--allow-root"] if os.geteuid() == 0 else []
STOP_S = 20  # seconds a server gets to exit after SIGTERM (its kernels after it) before SIGKILL


def wait_for_page(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """The page changes at human speed: poll it four times a second, for at most ``timeout``
    seconds; ``what`` says what was awaited when it times out."""
    return wait_for(predicate, timeout, 0.25, what)


def pythonpath() -> str:
    """This checkout first, so kernels import its netq whatever is installed."""
    extra = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(REPO)] + ([extra] if extra else []))


class ServedProcess(abc.ABC):
    """A frontend's server process: started in its own session with its output in a log file;
    ready once ``ready_path`` answers; stopped by pid, and every process it started too."""

    name = "server"

    def __init__(self, argv: list[str], *, env: Mapping[str, str], cwd: Path, home: Path,
                 port: int, ready_path: str, headers: Mapping[str, str] | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.headers = dict(headers or {})
        self.log_path = home / f"{self.name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=dict(env), cwd=cwd,
                                     start_new_session=True)
        self._stopped = False
        try:
            self._wait_ready(ready_path, SERVER_START_S)
        except BaseException:
            self.stop()
            raise

    def request(self, path: str, method: str = "GET") -> Any:
        """``path`` on this server (10 s bound); the JSON it answered, or None when empty."""
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers=self.headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        try:
            return json.loads(body) if body else None
        except ValueError:
            return None

    def _wait_ready(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # a bounded poll of the server's status page
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.log()}")
            try:
                self.request(path)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready on {path} after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        """The last 6000 characters of the server's output."""
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    @abc.abstractmethod
    def notebook_url(self, notebook: str) -> str:
        """Where the page of ``notebook`` (a file in the server's root) is, with the token."""

    def delete_kernels(self) -> None:  # noqa: B027 - servers without a kernels API: nothing
        """Shut the server's kernels down through its API (servers without one: nothing)."""

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Delete the kernels, SIGTERM the server by pid (SIGKILL after ``STOP_S``), then end
        whatever it started that is still running (its kernels), by pid. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.proc.poll() is None:
                self.delete_kernels()
        except (urllib.error.URLError, OSError):
            pass  # the server is going away anyway; the processes are ended below
        finally:
            children = self.descendants()
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
            for child in children:  # kernels its shutdown did not end
                try:
                    child.terminate()
                    child.wait(STOP_S)
                except psutil.NoSuchProcess:
                    pass
                except psutil.TimeoutExpired:
                    child.kill()
            self._log.close()


# JupyterLab's user settings (plugin settings file -> values): no news or update checks (no
# network), and every cell attached to the page (no windowing), so every view renders. Notebook
# 7 gets none: it attaches the few cells of its notebook by itself and fetches nothing (the
# test fails any request that leaves 127.0.0.1).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def jupyter_environment(home: Path, user_settings: Mapping[str, Any]) -> dict[str, str]:
    """An environment with its own Jupyter config/data/runtime/settings directories under
    ``home`` (``user_settings``: plugin settings file -> values), a ``python3`` kernel that is
    this interpreter with this checkout first, and the jupyter_bokeh lab extension disabled
    (labconfig/page_config.json of the config dir)."""
    kernels = home / "jupyter-path" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (netq test)", "language": "python",
        "env": {"PYTHONPATH": pythonpath()}}))
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {BOKEH_EXTENSION: True}}))
    settings = home / "settings"
    settings.mkdir()
    for plugin, values in user_settings.items():
        path = settings / plugin
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    prefixes = list(dict.fromkeys([sys.prefix, sys.base_prefix]))
    env = dict(os.environ)
    env.update({
        # lab extensions (the widget manager, anywidget) and voila's templates
        "JUPYTER_PATH": os.pathsep.join([str(home / "jupyter-path")] + [
            os.path.join(prefix, "share", "jupyter") for prefix in prefixes]),
        # server extensions are enabled in <prefix>/etc/jupyter; a venv with system site
        # packages would not see its base interpreter's
        "JUPYTER_CONFIG_PATH": os.pathsep.join(
            os.path.join(prefix, "etc", "jupyter") for prefix in prefixes),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
        "PYTHONPATH": pythonpath(),
    })
    return env


class JupyterServer(ServedProcess):
    """A jupyter_server application (JupyterLab, Notebook 7, Voila) with a token."""

    status_path = "/api/status"
    user_settings: Mapping[str, Any] = {}

    def __init__(self, root: Path, home: Path) -> None:
        self.token = secrets.token_hex(16)
        port = free_port()
        super().__init__(
            self.command(root, port, self.token),
            env=jupyter_environment(home, self.user_settings), cwd=root, home=home, port=port,
            ready_path=self.status_path, headers={"Authorization": f"token {self.token}"})

    @abc.abstractmethod
    def command(self, root: Path, port: int, token: str) -> list[str]:
        """The server's command line, listening on 127.0.0.1:``port`` with ``token``."""

    def delete_kernels(self) -> None:
        for kernel in self.request("/api/kernels") or []:
            self.request(f"/api/kernels/{kernel['id']}", method="DELETE")

    def kernel_states(self) -> list[str]:
        """Each kernel's execution state (``idle``, ``busy``, ``starting``); ``["unlisted"]``
        when the server could not list them this time.

        Jupyter Server answers 500 to a listing that meets a kernel it is still starting
        (its ``last_activity`` not yet set): the callers poll, so that answer is one more
        look, not a failure; a server that keeps answering it fails their bounded wait.
        """
        try:
            kernels = self.request("/api/kernels") or []
        except urllib.error.HTTPError as error:
            error.close()  # the response's socket
            if error.code < 500:
                raise
            return ["unlisted"]
        return [kernel["execution_state"] for kernel in kernels]


class JupyterLab(JupyterServer):
    name = "jupyterlab"
    user_settings = LAB_SETTINGS

    def command(self, root: Path, port: int, token: str) -> list[str]:
        return [sys.executable, "-m", "jupyterlab", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
                f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
                *ALLOW_ROOT]

    def notebook_url(self, notebook: str) -> str:
        return f"{self.url}/lab/workspaces/netq-test/tree/{notebook}?reset&token={self.token}"


class JupyterNotebook(JupyterServer):
    name = "notebook"

    def command(self, root: Path, port: int, token: str) -> list[str]:
        return [sys.executable, "-m", "notebook", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
                f"--ServerApp.root_dir={root}",
                "--JupyterNotebookApp.expose_app_in_browser=True", *ALLOW_ROOT]

    def notebook_url(self, notebook: str) -> str:
        return f"{self.url}/notebooks/{notebook}?token={self.token}"


class Voila(JupyterServer):
    """``voila NOTEBOOK``: the notebook is executed for each page load; its kernel stays up
    while the page is open."""

    name = "voila"
    notebook = "notebook.ipynb"  # set before starting: the one notebook voila serves
    status_path = "/voila/static/favicon.ico"  # voila has no /api/status; its static files

    def __init__(self, root: Path, home: Path, notebook: str) -> None:
        self.notebook = notebook
        super().__init__(root, home)

    def command(self, root: Path, port: int, token: str) -> list[str]:
        return [sys.executable, "-m", "voila", str(root / self.notebook), "--no-browser",
                "--Voila.ip=127.0.0.1", f"--Voila.port={port}", "--Voila.port_retries=0",
                f"--Voila.token={token}", "--VoilaConfiguration.show_tracebacks=True",
                # jupyter_bokeh's, and Notebook 7's lab extension, which fails in voila's page
                # (a shared module it expects from JupyterLab is missing)
                f"--VoilaConfiguration.extension_denylist={BOKEH_EXTENSION}",
                "--VoilaConfiguration.extension_denylist=@jupyter-notebook/lab-extension"]

    def notebook_url(self, notebook: str) -> str:
        return f"{self.url}/?token={self.token}"


class Marimo(ServedProcess):
    """``marimo run APP.py``: every page load is a session whose kernel (a thread of the
    server in run mode) runs the app's cells; it stays up while the page is connected."""

    name = "marimo"

    def __init__(self, root: Path, home: Path, app: str) -> None:
        port = free_port()
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": pythonpath(),
            "HOME": str(home),  # marimo's config and caches: this test's, not the user's
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_STATE_HOME": str(home / "state"),
            "MARIMO_SKIP_UPDATE_CHECK": "1",  # no network
        })
        super().__init__(
            [sys.executable, "-m", "marimo", "-y", "run", str(root / app), "--headless",
             "--host", "127.0.0.1", "--port", str(port), "--no-token", "--no-sandbox",
             "--session-ttl", "5"],
            env=env, cwd=root, home=home, port=port, ready_path="/health")

    def notebook_url(self, notebook: str) -> str:
        return f"{self.url}/"


# JavaScript: ``all(node, selector)``, querySelectorAll that also looks inside shadow roots
# (marimo draws widgets there): the first lines of the page functions below.
DEEP_QUERY_JS = """  const all = (node, selector) => {
    const found = [...node.querySelectorAll(selector)];
    for (const element of node.querySelectorAll('*'))
      if (element.shadowRoot) found.push(...all(element.shadowRoot, selector));
    return found;
  };
"""

# JavaScript: every netq view in ``root`` (default: the document), shadow roots included, as
# plain data. ``index`` is the view's position in this deep document order, which
# VIEW_BOX_JS uses to find it again.
VIEWS_JS = """(root) => {
""" + DEEP_QUERY_JS + """  const shown = (element) => element.getClientRects().length > 0
    && getComputedStyle(element).visibility !== 'hidden';
  // shown, and inside every box between it and ``view`` that clips what overflows it (a row
  // scrolled out of the table's box is shown but not seen)
  const seen = (element, view) => {
    if (!shown(element)) return false;
    const box = element.getBoundingClientRect();
    for (let parent = element.parentElement; parent != null && parent !== view;
         parent = parent.parentElement) {
      if (getComputedStyle(parent).overflow === 'visible') continue;
      const clip = parent.getBoundingClientRect();
      if (box.bottom <= clip.top || box.top >= clip.bottom
          || box.right <= clip.left || box.left >= clip.right) return false;
    }
    return true;
  };
  // an element's text nodes joined by spaces (its parts are separate elements, laid out
  // apart by CSS, with no space characters between them)
  const text = (element) => {
    if (element == null) return null;
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    const parts = [];
    while (walker.nextNode()) parts.push(walker.currentNode.nodeValue);
    return parts.join(' ').replace(/\\s+/g, ' ').trim();
  };
  return all(root ?? document, '.netq-view').map((view, index) => {
    const one = (selector) => all(view, selector)[0] ?? null;
    const box = view.getBoundingClientRect();
    const rows = all(view, 'tr.netq-peer');
    return {
      index,
      kind: view.classList.contains('netq-dashboard') ? 'dashboard'
        : view.classList.contains('netq-monitor') ? 'monitor' : view.className,
      live: view.dataset.live ?? null,
      state: one('.netq-title .netq-badge')?.dataset.state ?? null,
      title: text(one('.netq-title')),
      uptime: text(one('.netq-title .netq-uptime')),
      snapshot: text(one('.netq-snapshot')),
      peers: rows.map((row) => row.dataset.peer),
      shownPeers: rows.filter(shown).map((row) => row.dataset.peer),
      seenPeers: rows.filter((row) => seen(row, view)).map((row) => row.dataset.peer),
      total: all(view, 'tr.netq-total').length,
      others: all(view, 'tr.netq-others').length,
      sortable: all(view, 'th[data-sort]').map((th) => th.dataset.sort),
      filter: all(view, 'input.netq-filter').length,
      charts: all(view, 'svg.netq-chart').map((chart) => chart.dataset.metric),
      series: all(view, 'svg.netq-chart path.netq-series').map(
        (path) => [path.dataset.peer, path.getAttribute('d') ?? '']),
      legend: all(view, '.netq-legend .netq-legend-entry').map((entry) => entry.dataset.peer),
      communicators: all(view, 'tr.netq-communicator').map((row) => row.dataset.name),
      communicatorRows: Object.fromEntries(all(view, 'tr.netq-communicator').map(
        (row) => [row.dataset.name, text(row)])),
      links: all(view, 'tr.netq-link').map((row) => row.dataset.link),
      linkSparklines: all(view, 'tr.netq-link').map(
        (row) => all(row, 'svg.netq-sparkline').length),
      sparklines: all(view, 'svg.netq-sparkline').map(
        (svg) => [...svg.querySelectorAll('path, polyline')].map(
          (line) => line.getAttribute('d') ?? line.getAttribute('points') ?? '').join(' ')),
      map: all(view, 'svg.netq-map').length,
      stalls: all(view, '.netq-stalls').length,
      box: {x: box.x, y: box.y, width: box.width, height: box.height},
    };
  });
}"""

# JavaScript: scroll view number ``index`` (VIEWS_JS's order) into view; its box afterwards,
# the width of the output area holding it (the nearest ancestor that is one) and how far what
# it draws reaches from its top left corner (``drawn``: every element not clipped by a box
# inside the view, so content spilling out of the view's box counts).
VIEW_BOX_JS = """(index) => {
""" + DEEP_QUERY_JS + """  const view = all(document, '.netq-view')[index];
  if (view == null) return null;
  view.scrollIntoView({block: 'start'});
  const box = view.getBoundingClientRect();
  let area = view.parentElement;
  while (area != null && !area.matches('.jp-OutputArea-output, .jp-OutputArea'))
    area = area.parentElement;
  const drawn = {width: box.width, height: box.height};
  for (const element of all(view, '*')) {
    let clipped = false;
    for (let parent = element.parentElement; parent != null && parent !== view;
         parent = parent.parentElement)
      if (getComputedStyle(parent).overflow !== 'visible') { clipped = true; break; }
    if (clipped || element.getClientRects().length === 0) continue;
    const part = element.getBoundingClientRect();
    drawn.width = Math.max(drawn.width, part.right - box.left);
    drawn.height = Math.max(drawn.height, part.bottom - box.top);
  }
  return {x: box.x, y: box.y, width: box.width, height: box.height, drawn,
          area: area == null ? null : area.getBoundingClientRect().width};
}"""


def read_views(target) -> list[dict]:
    """The netq views in a page, or in one element (a playwright Locator), as VIEWS_JS reads
    them."""
    if hasattr(target, "evaluate_all"):  # a Locator: the views inside its first element
        return target.first.evaluate(VIEWS_JS)
    return target.evaluate(VIEWS_JS, None)


def title_port(view: Mapping[str, Any]) -> int | None:
    """The port of the ``127.0.0.1:PORT`` address in a view's title."""
    match = re.search(r"127\.0\.0\.1:(\d+)", view.get("title") or "")
    return int(match.group(1)) if match else None


def find_view(views: list[dict], kind: str, port: int | None = None,
              peer: str | None = None) -> dict | None:
    """The first view of ``kind`` whose title names ``port`` and whose table has ``peer``."""
    for view in views:
        if view["kind"] != kind or (port is not None and title_port(view) != port):
            continue
        if peer is not None and peer not in view["peers"]:
            continue
        return view
    return None


def screenshot_view(page, index: int, path: Path) -> tuple[dict, bytes]:
    """Scroll view ``index`` into view and save a screenshot of its box to ``path`` (a clip of
    the page: an element screenshot would wait for the live view to hold still). The box
    (px, with the width of the output area holding the view) and the PNG."""
    box = page.evaluate(VIEW_BOX_JS, index)
    assert box is not None, f"view {index} vanished before its screenshot {path.name}"
    assert box["width"] > 0 and box["height"] > 0, f"view {index} has no area: {box}"
    picture = page.screenshot(path=str(path), timeout=60_000, clip={
        "x": max(box["x"], 0), "y": max(box["y"], 0),
        "width": box["width"], "height": box["height"]})
    return box, picture


def cell_prompts(page) -> list[str]:
    """The execution prompts of a Jupyter notebook's cells ("[*]:", "[3]:", "[ ]:")."""
    return page.locator(".jp-Cell .jp-InputPrompt").all_inner_texts()


def run_all_cells(page, first_cell_started: Callable[[], bool]) -> None:
    """Run > Run All Cells from the menu bar (JupyterLab and Notebook 7 share it); again if
    the first cell has not started within 30 s (a click can land before the kernel is
    connected)."""
    for _ in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(
            no_wait_after=True, timeout=120_000)
        page.locator('li.lm-Menu-item[data-command="runmenu:run-all"]').click(
            no_wait_after=True, timeout=120_000)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if first_cell_started():
                return
            time.sleep(0.25)
        page.keyboard.press("Escape")  # a menu left open would swallow the next click
    raise AssertionError("Run > Run All Cells did not start the first cell (3 tries, 30 s each)")


# JavaScript, JupyterLab and Notebook 7 with the app exposed (expose_app_in_browser): the
# activated plugins' ids, and whether BokehJS was loaded into the page.
PLUGINS_JS = """() => {
  const app = window.jupyterapp;
  if (app == null) return null;
  const ids = typeof app.listPlugins === 'function' ? app.listPlugins()
    : [...app._plugins.keys()];
  return {plugins: ids.filter((id) => app.isPluginActivated(id)),
          registered: ids, bokeh: window.Bokeh !== undefined};
}"""


def files(directory: Path) -> Iterator[Path]:
    """The files under ``directory`` (for a failure report)."""
    return (path for path in sorted(directory.rglob("*")) if path.is_file())
