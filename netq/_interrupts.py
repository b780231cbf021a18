"""Ctrl-C while a ``get()`` on the main thread runs the I/O loop: deferred to a safe point.

A blocked ``get()`` may run the loop itself (leader/followers, ``Transport.lead``). On the main
thread, Python raises ``KeyboardInterrupt`` wherever that thread is when the user presses
Ctrl-C (or a notebook kernel is interrupted): inside a turn of the loop, between a ``recv``
and the parse that accounts for its bytes, or between counting a message as received and
queueing it, the link's state would be torn and a message could be lost. While the main
thread leads the loop, netq's SIGINT handler therefore only notes the interrupt and the loop
raises it at the end of the turn; while the loop waits for I/O (nothing consumed yet) the
interrupt is raised at once, as Python's own handler would.

The handler replaces Python's default one only, and only when a ``get()`` on the main thread
first leads the loop; it behaves exactly like the default one whenever no loop turn is under
way, and a handler the program installed itself is never touched (netq then leads the loop
from other threads only). A process whose SIGINT is ignored (started under ``nohup``, by a
service manager, as a background job of a non-interactive shell) or left to the operating
system's default action (the process ends, no Python code runs) can never see a
``KeyboardInterrupt`` there, so its main thread leads the loop as any other thread does, and
the disposition is left as it was.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # getsignal() without signal's enum conversion
import signal
import threading
from types import FrameType

__all__ = ("LoopTurns",)


class _State:
    deferring = False  # the main thread is inside a loop turn: note an interrupt, do not raise
    pending = False  # an interrupt arrived meanwhile: raise it at the end of the turn


_STATE = _State()
_SIGINT = int(signal.SIGINT)
_NO_INTERRUPT = (int(signal.SIG_IGN), int(signal.SIG_DFL))  # as _signal.getsignal reports them


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _STATE.deferring:
        _STATE.pending = True
        return
    raise KeyboardInterrupt


def _ours_or_installable() -> bool:
    """Whether the main thread's SIGINT goes to our handler (installing it over the default)."""
    current = _signal.getsignal(_SIGINT)
    if current is _on_sigint or current in _NO_INTERRUPT:
        return True  # ours, or no interrupt can ever be raised in this thread
    if current is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        return True
    return False


class LoopTurns:
    """Brackets the loop turns a thread runs for a caller; a no-op off the main thread."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = False

    @staticmethod
    def may_lead() -> bool:
        """May this thread lead the loop? Not the main thread under a program's own handler.

        On the main thread this installs netq's handler over Python's default one (see the
        module docstring); an ignored or operating-system default SIGINT is left as it is.
        """
        if threading.current_thread() is not threading.main_thread():
            return True
        return _ours_or_installable()

    def begin(self) -> None:
        """From now on this thread is inside loop turns (call on the leading thread)."""
        self.active = threading.current_thread() is threading.main_thread()
        if self.active:
            _STATE.deferring = True

    def waiting(self) -> None:
        """The turn waits for I/O and has consumed nothing: an interrupt may be raised now."""
        if self.active:
            _STATE.deferring = False
            if _STATE.pending:
                _STATE.pending = False
                raise KeyboardInterrupt

    def working(self) -> None:
        """The wait is over: interrupts are deferred again until the turn ends."""
        if self.active:
            _STATE.deferring = True

    def end_of_turn(self) -> None:
        """A turn ended: raise an interrupt that came during it."""
        if self.active and _STATE.pending:
            _STATE.pending = False
            raise KeyboardInterrupt

    def end(self) -> None:
        """This thread leaves the loop (always called, also on an exception)."""
        if self.active:
            _STATE.deferring = False
            self.active = False
