"""Widget tests: skipped without the [widgets] dependencies; ``frontend`` records comms.

When the dependencies are installed but ``netq.widgets`` cannot be imported (this checkout
is not the installed netq, or was installed before the widgets/ mapping existed), these
modules are not collected, and
``tests/display/test_notebook.py::test_netq_widgets_importable_when_its_dependencies_are`` fails
with the fix, so the rest of the suite still runs.
"""

from __future__ import annotations

import pytest

for _module in ("ipywidgets", "anywidget"):
    pytest.importorskip(_module, reason=f"{_module} missing: install netq[widgets]")

try:
    import netq.widgets  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]  # reported by tests/display/test_notebook.py
else:
    import comm as comm_package

    from widget_testing import Frontend

    @pytest.fixture
    def frontend(monkeypatch) -> Frontend:
        """Every widget comm opened during the test is recorded by this replica of a browser."""
        recorded = Frontend()
        monkeypatch.setattr(comm_package, "create_comm", recorded.create_comm)
        return recorded
