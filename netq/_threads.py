"""Running one call on a short-lived thread of its own, for the rare setup step that must not
run on the caller's thread (inside a running event loop; in another network namespace)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ("call_on_thread",)

T = TypeVar("T")


def call_on_thread(function: Callable[[], T], name: str) -> T:
    """``function()`` on a new thread called ``name``; waits for it and returns its result, or
    raises its exception on the caller's thread."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            outcome.append((False, error))

    helper = threading.Thread(target=run, name=name, daemon=True)
    helper.start()
    helper.join()
    succeeded, value = outcome[0]
    if not succeeded:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]  # function()'s own result
