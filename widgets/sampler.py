"""The sampling threads of the live views: one loop (:class:`SamplingThread`), and one
background sampler per communicator (:class:`Sampler`), shared by all of its monitors.

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

import abc
import collections
import logging
import sys
import threading
import time
from typing import Protocol as _Protocol

__all__ = ("SamplingThread", "Sampler", "View", "view_thread_class")

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


class SamplingThread(abc.ABC):
    """The loop of a view's sampling thread (``name``, a daemon), the monitor's sampler and
    the dashboard's alike: every ``interval`` seconds one :meth:`_tick`, until :meth:`stop`,
    until a tick says so, or until marimo re-runs or deletes the cell that started it; then
    :meth:`_finished`, on the thread. A thread that a tick ended counts as alive
    (:attr:`alive`) until that hook has returned. It never prints: an error is kept in ``errors``
    (and logged at DEBUG level on the ``netq.widgets`` logger). Its CPU time and lifetime
    are measured (:meth:`cpu_fraction`)."""

    def __init__(self, name: str, interval: float,
                 errors: collections.deque[BaseException] | None = None) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self.errors: collections.deque[BaseException] = (
            errors if errors is not None else collections.deque(maxlen=20))
        self.ticks = 0
        self.cpu_seconds = 0.0  # CPU time of the thread (time.thread_time)
        self.started_at = time.monotonic()
        self.stopped_at: float | None = None
        self.thread = view_thread_class()(target=self._run, name=name, daemon=True)

    @abc.abstractmethod
    def _tick(self) -> bool:
        """Sample once for the views; False ends the thread."""

    @abc.abstractmethod
    def _finished(self) -> None:
        """The thread is ending (after its last tick; on the thread)."""

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """End the thread (within one interval) and wait for it, unless called on it."""
        self._stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self._stop.is_set() and not self._cell_gone()

    def _cell_gone(self) -> bool:
        """marimo re-ran or deleted the cell that started this thread (False elsewhere)."""
        return bool(getattr(self.thread, "should_exit", False))

    @property
    def wall_seconds(self) -> float:
        """The thread's lifetime so far (or in all, once it ended), in seconds."""
        end = self.stopped_at if self.stopped_at is not None else time.monotonic()
        return end - self.started_at

    def cpu_fraction(self) -> float:
        """CPU time of the thread / its wall-clock lifetime (1.0 = one core)."""
        return self.cpu_seconds / max(self.wall_seconds, 1e-9)

    def _run(self) -> None:
        cpu_start = time.thread_time()
        try:
            while not self._stop.wait(self.interval) and not self._cell_gone():
                going_on = self._tick()
                self.ticks += 1
                self.cpu_seconds = time.thread_time() - cpu_start
                if not going_on:
                    break
        finally:
            # The hook first: until it has frozen the views, the thread counts as alive, so
            # that nobody reads "stopped" off a view that is about to say "closed".
            try:
                self._finished()
            except Exception as error:  # noqa: BLE001 - never print from a thread
                self._record(error)
            self._stop.set()
            self.cpu_seconds = time.thread_time() - cpu_start
            self.stopped_at = time.monotonic()

    def _record(self, error: BaseException) -> None:
        self.errors.append(error)
        LOGGER.debug("netq view sampling: %r", error, exc_info=error)


class Sampler(SamplingThread):
    """Samples one communicator for its views. Use :meth:`attach` / :meth:`detach`.

    The thread (``netq-monitor-<id>``) calls ``statistics()`` every ``interval`` seconds and
    hands the same frozen snapshot to every attached view, so two monitors of one
    communicator cost one snapshot per tick and show the same numbers. It stops when the
    communicator has closed (after handing that closed snapshot to its views) or when its
    last view detaches; a view that raises is detached."""

    _registry: dict[int, Sampler] = {}  # id(communicator) -> its running sampler
    _registry_lock = threading.Lock()

    def __init__(self, communicator, interval: float) -> None:
        super().__init__(f"netq-monitor-{str(communicator.id)[:8]}", interval)
        self.communicator = communicator
        self._views: list = []
        self._lock = threading.Lock()
        self._last = None  # the last snapshot taken

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
            sampler.start()
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
    def views(self) -> tuple:
        with self._lock:
            return tuple(self._views)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop sampling for every view and wait for the thread."""
        self._stop.set()
        self._unregister()
        super().stop(timeout)

    # -- the thread ---------------------------------------------------------------------

    def _tick(self) -> bool:
        try:
            stats = self.communicator.statistics()
        except Exception as error:  # noqa: BLE001 - never print from a thread
            self._record(error)
            return False
        self._last = stats
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
                return False
        return True

    def _finished(self) -> None:
        self._stop.set()
        self._unregister()
        for view in self.views:
            try:
                view._sampler_stopped(self._last)
            except Exception as error:  # noqa: BLE001
                self._record(error)
