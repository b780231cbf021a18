"""Widget tests: skipped without the [widgets] dependencies; ``frontend`` records comms."""

from __future__ import annotations

import pytest

for _module in ("ipywidgets", "bokeh", "jupyter_bokeh"):
    pytest.importorskip(_module, reason=f"{_module} missing: install netq[widgets]")

import comm as comm_package  # noqa: E402

try:
    import netq.widgets  # noqa: E402,F401
except ImportError as error:  # the dependencies are there: the install itself is broken
    raise ImportError(f"netq.widgets is not importable ({error}); it is mapped from the "
                      "top-level widgets/ folder by pyproject.toml: reinstall this checkout "
                      "with pip install -e '.[widgets]'") from error

from widget_testing import Frontend  # noqa: E402


@pytest.fixture
def frontend(monkeypatch) -> Frontend:
    """Every widget comm opened during the test is recorded by this replica of a browser."""
    recorded = Frontend()
    monkeypatch.setattr(comm_package, "create_comm", recorded.create_comm)
    return recorded
