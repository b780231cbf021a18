"""The Jupyter and marimo hooks: how a communicator shows itself in a notebook.

``Communicator._repr_mimebundle_``, ``_ipython_display_``, ``_display_`` and ``monitor()``
call these: a live ``netq.widgets.Monitor`` inside a kernel when the widget dependencies are
installed, else the static form (:func:`netq.display.static_form.static_bundle`,
:class:`StaticSummary`).

netq.widgets is the one package above this one that is named here: it is optional (the
``netq[widgets]`` extra), so it is imported only inside the hooks, when a notebook asks for a
live view, and never when netq or netq.display is imported.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Mapping

from .kernel import in_kernel
from .static_form import static_bundle

__all__ = ("in_kernel", "StaticSummary", "widgets_missing", "monitor", "communicator_bundle",
           "communicator_display", "communicator_marimo")


class StaticSummary:
    """A communicator's summary as text and HTML (one snapshot drawn both ways, so the two
    agree), fresh at each display until :meth:`freeze`; no thread.

    What ``Communicator.monitor()`` returns when the widget dependencies are not installed:
    it has the monitor's ``start``, ``stop``, ``freeze`` and ``frozen``.
    """

    def __init__(self, communicator, names: Mapping[uuid.UUID, str] | None = None,
                 max_rows: int | None = 50, reason: str = "") -> None:
        self.communicator = communicator
        self.names = names
        self.max_rows = max_rows
        self.reason = reason  # why this is not a live widget
        self._kept: dict[str, str] | None = None  # once frozen: the bundle shown for good

    def static_bundle(self) -> dict[str, str]:
        """``text/plain`` + ``text/html`` of a fresh snapshot (once frozen, the kept one)."""
        if self._kept is not None:
            return dict(self._kept)
        return static_bundle(self.communicator.statistics(), self.names, self.max_rows)

    def __repr__(self) -> str:
        return self.static_bundle()["text/plain"]

    def _repr_html_(self) -> str:
        return self.static_bundle()["text/html"]

    def freeze(self) -> StaticSummary:
        """Keep the summary of this moment (calling it again does nothing)."""
        if self._kept is None:
            self._kept = self.static_bundle()
        return self

    @property
    def frozen(self) -> bool:
        return self._kept is not None

    def start(self) -> StaticSummary:  # the Monitor interface: shows fresh snapshots again
        self._kept = None
        return self

    def stop(self) -> None:
        pass


def widgets_missing() -> str | None:
    """Why ``netq.widgets`` cannot be imported (None when it can)."""
    try:
        import netq.widgets  # noqa: F401
    except ImportError as error:
        return (f"live widgets need the netq[widgets] extra "
                f"(pip install 'netq[widgets]'): {error}")
    return None


def monitor(communicator, **options):
    """``Communicator.monitor()``: a live ``netq.widgets.Monitor``, or a StaticSummary."""
    reason = widgets_missing()
    if reason is not None:
        warnings.warn(reason, stacklevel=3)
        return StaticSummary(communicator, options.get("names"), reason=reason)
    from netq.widgets import Monitor

    return Monitor(communicator, **options)


def communicator_bundle(communicator, include=None, exclude=None) -> dict | tuple[dict, dict]:
    """``Communicator._repr_mimebundle_``: live in a kernel with the widgets (with metadata
    where the frontend needs some), else static."""
    if in_kernel() and widgets_missing() is None:
        from netq.widgets import Monitor

        return Monitor(communicator)._repr_mimebundle_(include, exclude)
    return static_bundle(communicator.statistics())


def communicator_display(communicator) -> None:
    """``Communicator._ipython_display_``: a live monitor displayed with a display id (its
    static form replaces it when it stops), or the static summary."""
    from IPython.display import display

    if in_kernel() and widgets_missing() is None:
        from netq.widgets import Monitor

        Monitor(communicator)._ipython_display_()
        return
    display(static_bundle(communicator.statistics()), raw=True)


def communicator_marimo(communicator):
    """``Communicator._display_`` (marimo asks it first): a live monitor, started, whose
    anywidget marimo renders; without the widgets, the static summary."""
    if widgets_missing() is None:
        from netq.widgets import Monitor

        return Monitor(communicator)._display_()
    return StaticSummary(communicator)
