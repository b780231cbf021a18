"""One background sampler per communicator, shared by all of its live views.

The sampler thread (``netq-monitor-<id>``, a daemon) calls ``statistics()`` every ``interval``
seconds and hands the same frozen snapshot to every attached view, so two monitors of one
communicator cost one snapshot per tick and show the same numbers. It stops when the
communicator has closed (after one last sample showing ``closed``) or when its last view
detaches. It never prints: a view that raises is detached and the error kept in
:attr:`Sampler.errors` (and logged at DEBUG level on the ``netq.widgets`` logger).

Under marimo the thread is a ``marimo.Thread`` (started from the cell that displayed the view):
marimo then tells it when that cell is re-run or deleted (``should_exit``), and the sampler
ends instead of feeding a widget marimo has closed. Everywhere else it is a plain
``threading.Thread``.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from typing import Protocol as _Protocol

__all__ = ("Sampler", "View", "view_thread_class")

LOGGER = logging.getLogger("netq.widgets")
DEFAULT_INTERVAL = 0.5  # seconds: 2 Hz


def view_thread_class() -> type[threading.Thread]:
    """The thread class a view's sampling thread is made of: ``marimo.Thread`` inside a
    running marimo notebook or app (it learns when the cell that started it is re-run or
    deleted: ``should_exit``), else ``threading.Thread``."""
    marimo = sys.modules.get("marimo")  # never imported here: only if the user runs marimo
    if marimo is not None:
        try:
            if marimo.running_in_notebook():
                return marimo.Thread
        except Exception:  # noqa: BLE001 - any doubt about marimo: a plain thread
            pass
    return threading.Thread


class View(_Protocol):
    def _sample(self, stats) -> None: ...  # called on the sampler thread
    def _sampler_stopped(self, stats) -> None: ...  # the last snapshot, then no more calls


class Sampler:
    """Samples one communicator for its views. Use :meth:`attach` / :meth:`detach`."""

    _registry: dict[int, Sampler] = {}  # id(communicator) -> its running sampler
    _registry_lock = threading.Lock()

    def __init__(self, communicator, interval: float) -> None:
        self.communicator = communicator
        self.interval = interval
        self._views: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors: collections.deque = collections.deque(maxlen=20)
        self.ticks = 0
        self.cpu_seconds = 0.0  # CPU time of the sampler thread (time.thread_time)
        self.started_at = time.monotonic()
        self.stopped_at: float | None = None
        name = f"netq-monitor-{str(communicator.id)[:8]}"
        self.thread = view_thread_class()(target=self._run, name=name, daemon=True)

    # -- registry -------------------------------------------------------------------------

    @classmethod
    def attach(cls, communicator, view, interval: float = DEFAULT_INTERVAL) -> Sampler:
        """Add ``view`` to the communicator's sampler, starting one if none runs."""
        with cls._registry_lock:
            sampler = cls._registry.get(id(communicator))
            if sampler is not None and sampler.communicator is communicator:
                with sampler._lock:  # the thread sets _stop under this lock when it ends
                    if not sampler._stop.is_set() and not sampler._cell_gone():
                        if view not in sampler._views:
                            sampler._views.append(view)
                        sampler.interval = min(sampler.interval, interval)
                        return sampler
            sampler = cls(communicator, interval)
            cls._registry[id(communicator)] = sampler
            sampler._views.append(view)
            sampler.thread.start()
        return sampler

    @classmethod
    def running(cls, communicator) -> Sampler | None:
        """The communicator's live sampler, if any."""
        with cls._registry_lock:
            sampler = cls._registry.get(id(communicator))
        if sampler is None or sampler.communicator is not communicator or not sampler.alive:
            return None
        return sampler

    def detach(self, view) -> None:
        """Remove ``view``; the thread ends (within one interval) when none is left."""
        with self._lock:
            if view in self._views:
                self._views.remove(view)
            if not self._views:
                self._stop.set()
        if self._stop.is_set():
            self._unregister()

    def _unregister(self) -> None:
        with self._registry_lock:
            if self._registry.get(id(self.communicator)) is self:
                del self._registry[id(self.communicator)]

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self._stop.is_set() and not self._cell_gone()

    def _cell_gone(self) -> bool:
        """marimo re-ran or deleted the cell that started this thread (False elsewhere)."""
        return bool(getattr(self.thread, "should_exit", False))

    @property
    def views(self) -> tuple:
        with self._lock:
            return tuple(self._views)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop sampling for every view and wait for the thread."""
        self._stop.set()
        self._unregister()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def cpu_fraction(self) -> float:
        """CPU time of the sampler thread / its wall-clock lifetime (1.0 = one core)."""
        end = self.stopped_at if self.stopped_at is not None else time.monotonic()
        return self.cpu_seconds / max(end - self.started_at, 1e-9)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        cpu_start = time.thread_time()
        stats = None
        try:
            while not self._stop.wait(self.interval) and not self._cell_gone():
                try:
                    stats = self.communicator.statistics()
                except Exception as error:  # noqa: BLE001 - never print from a thread
                    self._record(error)
                    break
                self.ticks += 1
                for view in self.views:
                    try:
                        view._sample(stats)
                    except Exception as error:  # noqa: BLE001 - a broken view is detached
                        self._record(error)
                        with self._lock:
                            if view in self._views:
                                self._views.remove(view)
                with self._lock:
                    if stats.state == "closed" or not self._views:
                        self._stop.set()
                        break
                self.cpu_seconds = time.thread_time() - cpu_start
        finally:
            self._stop.set()
            self._unregister()
            for view in self.views:
                try:
                    view._sampler_stopped(stats)
                except Exception as error:  # noqa: BLE001
                    self._record(error)
            self.cpu_seconds = time.thread_time() - cpu_start
            self.stopped_at = time.monotonic()

    def _record(self, error: BaseException) -> None:
        self.errors.append(error)
        LOGGER.debug("netq monitor sampler: %r", error, exc_info=error)
