"""The receive hot path in Python calls: what a get() and a loop turn's arrival cost.

In a request/response exchange every wake-up runs with cold caches, so each Python-level call
on the way costs far more than in a hot loop; the count of calls, not their speed here, is
what these tests pin (it does not depend on the machine's load). A profiler hook counts the
calls made on this thread, as ``bench/hotpath.py --cprofile`` would.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from netq_testing import wait_for

T = 30.0  # seconds any single blocking step may take before the test is considered stuck

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("transport", ["tcp"],
                                                               indirect=True)]


@contextmanager
def python_calls() -> Iterator[Counter[str]]:
    """Python functions entered on this thread meanwhile, by name (C calls not counted), of
    netq and of the standard library (the test's own code and this helper left out)."""
    calls: Counter[str] = Counter()
    ignored = {__file__, contextlib.__file__}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename not in ignored:
            calls[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1

    previous: Callable[..., object] | None = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


def _twelve_queued(transport, make):
    """A server holding twelve messages ``make(index)`` from a client, the first taken (it is
    lent: every get() after it settles one)."""
    server = transport.make_server()
    client = transport.connect(server)
    for index in range(12):
        client.put(make(index))
    wait_for(lambda: server.statistics().peers and server.statistics().peers[0].queue_in == 12,
             T, message="the twelve messages to arrive")
    assert server.get(timeout=T).data == make(0)
    return server


@pytest.mark.parametrize("make", [lambda index: index, lambda index: [index]],
                         ids=["int", "list"])
def test_a_get_that_finds_its_message_makes_three_python_calls(transport, make):
    """get(), the inbox's take() and the receive budget's settle_lent() (what the previous
    get() lent is consumed now): nothing else per message. A message of one part (a pickle
    with no out-of-band buffer) is unpickled inline (netq.serializers.InlineForms)."""
    server = _twelve_queued(transport, make)
    with python_calls() as calls:
        got = [server.get(timeout=T).data for _ in range(10)]
    assert got == [make(index) for index in range(1, 11)]
    assert sum(calls.values()) == 3 * 10, calls
    assert calls["credit.py:settle_lent"] == 10 and calls["inbox.py:take"] == 10, calls


def test_a_message_of_several_parts_adds_the_serializers_load_parts(transport):
    """Large bytes travel by reference, beside their pickle: load_parts() puts them back."""
    large = 1 << 16
    server = _twelve_queued(transport, lambda index: bytes([index]) * large)
    with python_calls() as calls:
        got = [server.get(timeout=T).data for _ in range(10)]
    assert got == [bytes([index]) * large for index in range(1, 11)]
    assert calls["serializers.py:load_parts"] == 10, calls
