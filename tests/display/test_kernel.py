"""netq/display/kernel.py: whether this process is a Jupyter kernel."""

from __future__ import annotations

import sys
import types

from netq.display.kernel import in_kernel


def test_not_in_a_kernel_here():
    assert in_kernel() is False


def test_an_ipython_shell_with_a_kernel_is_a_kernel(monkeypatch):
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert in_kernel() is True
    shell.kernel = None  # the IPython terminal: a shell, no kernel
    assert in_kernel() is False


def test_a_half_initialized_ipython_is_no_kernel(monkeypatch):
    def broken():
        raise RuntimeError("not ready")
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=broken))
    assert in_kernel() is False
