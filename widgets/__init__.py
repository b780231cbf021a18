"""netq.widgets: live Jupyter views of netq communicators (the ``netq[widgets]`` extra).

This package lives in the repository's top-level ``widgets/`` folder and is installed as
``netq.widgets`` (a setuptools ``package-dir`` mapping in ``pyproject.toml``). Core netq never
imports it at import time: ``Communicator.monitor()`` and a communicator displayed in a
notebook (or marimo) import it lazily and fall back to a static text/HTML summary when
anywidget or ipywidgets are missing. The views are anywidget widgets whose ES modules and CSS
ship in ``widgets/frontend/``: no lab extension, no CDN.

    import netq as nq
    server = nq.new(purpose=nq.Purpose.SERVER)
    server              # last expression of a cell: a live monitor
    server.monitor()    # the same, with options (interval=, names=, history=, ...)
    netq.widgets.dashboard()   # every communicator of the kernel and the links between them

See ``docs/widgets.md``.
"""

from __future__ import annotations

# The [widgets] extra first: without it the import fails naming anywidget, the library the
# extra brings (ipywidgets and traitlets come with it), not whichever module was needed first.
import anywidget  # noqa: F401

from .dashboard import Dashboard, dashboard
from .monitor import Monitor, MonitorWidget, PeerTable, PlotHistory
from .sampler import Sampler

__all__ = ("Monitor", "MonitorWidget", "PeerTable", "PlotHistory", "Sampler", "Dashboard",
           "dashboard")
