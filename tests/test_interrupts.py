"""netq._interrupts: which SIGINT dispositions let a get() on the main thread lead the loop,
and what an interrupt does while it leads.

The tests set the disposition they need and restore the one they found, so they do not depend
on what the test process inherited (an ignored SIGINT under ``nohup`` or a background CI step).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from netq._interrupts import LoopTurns


def _programs_own_handler(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _may_lead() -> bool:
    """LoopTurns.begin() on a fresh bracket, ended at once: may this thread lead the loop?"""
    turns = LoopTurns()
    try:
        return turns.begin()
    finally:
        if turns.active:
            turns.end()


@pytest.fixture
def restore_sigint() -> Iterator[None]:
    assert threading.current_thread() is threading.main_thread()
    found = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, found)


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL],
                         ids=["ignored", "os-default"])
def test_no_interrupt_can_arrive_so_the_main_thread_leads_and_keeps_the_disposition(
        restore_sigint, disposition):
    signal.signal(signal.SIGINT, disposition)
    assert _may_lead()
    assert signal.getsignal(signal.SIGINT) is disposition


def test_pythons_default_handler_is_replaced_by_the_deferring_one(restore_sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    assert _may_lead()
    replaced = signal.getsignal(signal.SIGINT)
    assert replaced is not signal.default_int_handler
    assert _may_lead()  # and it is recognised as netq's own from then on
    assert signal.getsignal(signal.SIGINT) is replaced


def test_a_programs_own_handler_is_never_touched(restore_sigint):
    signal.signal(signal.SIGINT, _programs_own_handler)
    assert not _may_lead()
    assert signal.getsignal(signal.SIGINT) is _programs_own_handler


def test_other_threads_always_lead_and_defer_nothing(restore_sigint):
    signal.signal(signal.SIGINT, _programs_own_handler)
    turns = LoopTurns()
    answers: list[tuple[bool, bool, bool]] = []
    thread = threading.Thread(
        target=lambda: answers.append((turns.begin(), turns.active, LoopTurns.deferring)))
    thread.start()
    thread.join(10)
    assert answers == [(True, False, False)]


def test_begin_brackets_the_main_threads_turns_and_end_lets_go(restore_sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    turns = LoopTurns()
    assert turns.begin() and turns.active and LoopTurns.deferring
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # ours now
    turns.end()
    assert not turns.active and not LoopTurns.deferring


def test_an_interrupt_during_a_turn_waits_for_its_end(restore_sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    turns = LoopTurns()
    assert turns.begin()
    try:
        signal.raise_signal(signal.SIGINT)  # lands inside the turn: noted, not raised
        assert LoopTurns.pending
        with pytest.raises(KeyboardInterrupt):
            turns.end_of_turn()
        assert not LoopTurns.pending
    finally:
        turns.end()
    with pytest.raises(KeyboardInterrupt):  # outside a turn: raised at once, as Python does
        signal.raise_signal(signal.SIGINT)


def test_a_handler_the_program_installs_later_is_honoured_on_the_next_lead(restore_sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    turns = LoopTurns()
    assert turns.begin()
    turns.end()
    signal.signal(signal.SIGINT, _programs_own_handler)  # after netq installed its own
    assert not turns.begin() and not turns.active and not LoopTurns.deferring
    assert signal.getsignal(signal.SIGINT) is _programs_own_handler


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
def test_in_a_child_forked_by_another_thread_that_thread_is_the_main_one(restore_sigint):
    """After a fork the forking thread is the child's main thread (Python runs the child's
    signal handlers there): its leads bracket their turns, as the main thread's do."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    read_end, write_end = os.pipe()
    pids: list[int] = []

    def fork_here() -> None:
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running any cleanup
            code = 1
            try:
                turns = LoopTurns()
                code = 0 if turns.begin() and turns.active else 2
                turns.end()
            finally:
                os.write(write_end, bytes([code]))
                os._exit(0)
        pids.append(pid)

    forker = threading.Thread(target=fork_here)
    forker.start()
    forker.join(10)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"\0"
    finally:
        os.close(read_end)
        for pid in pids:
            os.waitpid(pid, 0)
