"""What people read about a communicator: the one place that turns a statistics snapshot into
text, tables, charts and notebook displays, shared by the terminal demo (``python -m netq
demo``), the static text/HTML summary and the live Jupyter widgets (``netq.widgets``).

Standard library only: the core package and the demo need none of the widget dependencies.
Each module imports only the ones listed before it here, :mod:`netq.statistics` and
:mod:`netq.diagnostics`: none imports the netq package, the communicator or anything else above
it. The one name above it is the optional ``netq.widgets``, which the notebook hooks import
only when a live view is asked for (never at import time).

* :mod:`~netq.display.formatting`: counts, rates (MiB/s), bytes (binary units), addresses,
  durations and axis ticks as text.
* :mod:`~netq.display.tables`: the per-peer columns (:data:`~netq.display.tables.COLUMNS`),
  one row as numbers or text, the whole snapshot as a fixed-width text table.
* :mod:`~netq.display.charts`: what the monitor's charts plot, their axes and geometry, and
  the static form's inline SVG.
* :mod:`~netq.display.view_model`: the monitor's title, rows and totals as JSON-ready data,
  drawn by the live widget and by the static form alike.
* :mod:`~netq.display.static_form`: the monitor without script (HTML, inlined stylesheet)
  and the text/HTML bundle of a snapshot.
* :mod:`~netq.display.notebook`: the hooks a communicator's ``_repr_mimebundle_``,
  ``_ipython_display_``, ``_display_`` and ``monitor()`` call (live widget or static form).
* :mod:`~netq.display.kernel`: whether this process is a Jupyter kernel (the widgets ask too).
* :mod:`~netq.display.environment`: the versions and the machine a measurement ran on.

Re-exported here: what the notebooks import
(:func:`~netq.display.environment.environment_line`,
:func:`~netq.display.notebook.widgets_missing`).
"""

from __future__ import annotations

from .environment import environment_line
from .notebook import widgets_missing

__all__ = ("environment_line", "widgets_missing")
