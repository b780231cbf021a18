"""Ctrl-C while a ``get()`` on the main thread runs the I/O loop: deferred to a safe point.

A blocked ``get()`` may run the loop itself (leader/followers, ``IOLoop.lead``). On the main
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
import os
import signal
import threading
from types import FrameType
from typing import ClassVar

__all__ = ("LoopTurns", "SIGINT_NUMBER", "on_sigint", "sigint_disposition")

SIGINT_NUMBER = _SIGINT = int(signal.SIGINT)
_NO_INTERRUPT = (int(signal.SIG_IGN), int(signal.SIG_DFL))  # as _signal.getsignal reports them
sigint_disposition = _getsignal = _signal.getsignal  # call with SIGINT_NUMBER
_get_ident = threading.get_ident


def _after_fork_in_child() -> None:
    LoopTurns.main_ident = _get_ident()
    LoopTurns.deferring = LoopTurns.pending = False  # the turn that deferred is the parent's


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """netq's SIGINT handler: raise, as Python's own, unless a loop turn is under way."""
    if LoopTurns.deferring:
        LoopTurns.pending = True
        return
    raise KeyboardInterrupt


class LoopTurns:
    """Brackets the loop turns a thread runs for a caller; a no-op off the main thread.

    ``active`` (per instance): the thread that leads now is the main thread, inside its turns.
    The class attributes are the main thread's interrupt state, shared by every transport:
    ``deferring`` while a turn is under way (the handler notes an interrupt instead of raising
    it) and ``pending`` once it noted one. They are plain attributes so that the loop looks at
    them without a call per turn: ``if turns.active and turns.pending: turns.end_of_turn()``.
    """

    __slots__ = ("active",)

    # The thread Python runs signal handlers on. It changes only in a forked child, where the
    # thread that forked becomes the main thread (see _after_fork_in_child).
    main_ident: ClassVar[int | None] = threading.main_thread().ident
    deferring: ClassVar[bool] = False  # the main thread is inside a loop turn: note, not raise
    pending: ClassVar[bool] = False  # an interrupt arrived meanwhile: raise it after the turn

    def __init__(self) -> None:
        self.active = False

    def begin(self) -> bool:
        """May this thread lead the loop? If so, it is inside loop turns from now on (call on
        the thread about to lead; :meth:`end` when it leaves, if ``active``).

        Any thread but the main one may. The main thread may unless a SIGINT handler of the
        program's own is installed (never touched); this installs netq's handler over
        Python's default one (see the module docstring), and leaves an ignored or
        operating-system default SIGINT as it is. The disposition is read on every call (one
        C call): a handler the program installs at any time is honoured from its next lead.
        """
        if _get_ident() != LoopTurns.main_ident:
            return True  # not the main thread: no interrupt lands here, nothing to defer
        current = _getsignal(_SIGINT)
        if current is not on_sigint and current not in _NO_INTERRUPT:
            if current is not signal.default_int_handler:
                return False  # the program's own handler: never touched
            signal.signal(signal.SIGINT, on_sigint)
        self.active = True
        LoopTurns.deferring = True
        return True

    def waiting(self) -> None:
        """The turn waits for I/O and has consumed nothing: an interrupt may be raised now."""
        if self.active:
            LoopTurns.deferring = False
            if LoopTurns.pending:
                LoopTurns.pending = False
                raise KeyboardInterrupt

    def working(self) -> None:
        """The wait is over: interrupts are deferred again until the turn ends."""
        if self.active:
            LoopTurns.deferring = True

    def end_of_turn(self) -> None:
        """A turn ended: raise an interrupt that came during it."""
        if self.active and LoopTurns.pending:
            LoopTurns.pending = False
            raise KeyboardInterrupt

    def end(self) -> None:
        """This thread leaves the loop (always called when ``active``, also on an exception)."""
        if self.active:
            LoopTurns.deferring = False
            self.active = False
