"""Whether this process is a Jupyter kernel, where a widget can live.

Its own module, below :mod:`netq.display.notebook`: the widgets ask it too, and the notebook
hooks import the widgets, so a widget importing the hooks' module would close a circle.
"""

from __future__ import annotations

import sys

__all__ = ("in_kernel",)


def in_kernel() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel), where widgets can live.

    False in plain Python and the IPython terminal. (nbval and nbconvert run a kernel too:
    there the display carries the static text/HTML next to the widget.)
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - a half-initialized IPython is "no kernel"
        return False
    return getattr(shell, "kernel", None) is not None
