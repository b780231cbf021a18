"""netq/display/notebook.py: the communicator's notebook hooks, without and with the widgets."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_core_netq_works_without_the_widget_dependencies():
    """ipywidgets, anywidget and bokeh made unimportable: netq imports, serves, and its
    displays fall back to static text/HTML (the monitor's static form, a snapshot)."""
    script = textwrap.dedent("""
        import sys, time, warnings
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("ipywidgets", "anywidget", "bokeh", "comm"):
                    raise ImportError(f"blocked {name}")
        sys.meta_path.insert(0, Block())
        import netq as nq
        from netq.lab import demo
        from netq.display.notebook import StaticSummary
        assert not [m for m in sys.modules
                    if m.startswith(("ipywidgets", "anywidget", "bokeh", "netq.widgets"))]
        server = nq.new(purpose=nq.Purpose.SERVER, options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(host="127.0.0.1", port=0)))
        bundle = server._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html"}, bundle
        assert 'data-live="0"' in bundle["text/html"] and "snapshot taken" in bundle["text/html"]
        assert ".netq-monitor" in bundle["text/html"]  # the shipped stylesheet, inlined
        widget = server._display_()  # marimo's hook: the static summary
        assert isinstance(widget, StaticSummary), widget
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            view = server.monitor()
        assert isinstance(view, StaticSummary), view
        assert "netq[widgets]" in str(caught[0].message)
        assert repr(view).startswith("netq TCP server on ") and "netq-peers" in view._repr_html_()
        assert view.freeze() is view and view.frozen and view.freeze() is view
        kept = (repr(view), view._repr_html_())
        client = nq.new(purpose=nq.Purpose.CLIENT, options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(host="127.0.0.1", port=server.address[1])))
        deadline = time.monotonic() + 30
        while not server.peers and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.peers and (repr(view), view._repr_html_()) == kept  # frozen: as it was
        assert "1 peer" in repr(view.start())  # live again: a fresh snapshot
        client.close()
        server.close()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_netq_widgets_importable_when_its_dependencies_are():
    """With ipywidgets and anywidget installed, netq.widgets must import (it is mapped from
    the top-level widgets/ folder; tests/widgets is not collected otherwise)."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("ipywidgets", "anywidget")):
        import pytest

        pytest.skip("the [widgets] dependencies are not installed")
    try:
        import netq.widgets  # noqa: F401
    except ImportError as error:
        raise AssertionError(
            f"netq.widgets is not importable ({error}): it is mapped from the top-level "
            "widgets/ folder by pyproject.toml; reinstall this checkout: "
            "pip install -e '.[widgets]'") from None
