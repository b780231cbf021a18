"""The byte-stream loop's poller (netq/transports/poller.py), epoll and selectors forms alike,
over real socket pairs: what is ready comes back with the data it was registered with, an
error or hang-up reports the socket ready for what it waits for, misuse is a KeyError; and the
wake-up descriptor (eventfd and socket-pair forms alike)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from netq.transports.poller import EPOLL, EVENT_READ, EVENT_WRITE, Poller, WakeUp

pytestmark = pytest.mark.timeout(30)

T = 10.0  # seconds: a wait for a socket that is ready must end long before this


@pytest.fixture(params=[pytest.param(True, id="epoll"), pytest.param(False, id="selectors")])
def poller(request):
    if request.param and not EPOLL:
        pytest.skip("no epoll on this platform")
    poller = Poller(epoll=request.param)
    yield poller
    poller.close()


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def test_a_readable_socket_comes_back_with_its_data(poller, pair):
    left, right = pair
    poller.register(left, EVENT_READ, "left")
    assert poller.select(0) == []
    right.send(b"x")
    assert poller.select(T) == [("left", EVENT_READ)]
    assert len(poller) == 1


def test_only_the_events_asked_for_are_reported(poller, pair):
    left, right = pair
    poller.register(left, EVENT_WRITE, "left")
    right.send(b"x")  # readable too, but only writability was asked for
    assert poller.select(T) == [("left", EVENT_WRITE)]
    poller.modify(left, EVENT_READ | EVENT_WRITE, "both")
    assert poller.select(T) == [("both", EVENT_READ | EVENT_WRITE)]
    poller.modify(left, EVENT_READ, "read")
    assert poller.select(T) == [("read", EVENT_READ)]


def test_a_hang_up_reports_the_socket_ready_for_what_it_waits_for(poller, pair):
    left, right = pair
    poller.register(left, EVENT_READ, "left")
    right.close()
    assert poller.select(T) == [("left", EVENT_READ)]
    assert left.recv(1) == b""  # the read that follows meets the end


def test_an_unregistered_socket_is_not_reported(poller, pair):
    left, right = pair
    poller.register(left, EVENT_READ, "left")
    poller.unregister(left)
    right.send(b"x")
    assert poller.select(0) == []
    assert len(poller) == 0


def test_misuse_is_a_key_error(poller, pair):
    left, right = pair
    with pytest.raises(KeyError):
        poller.modify(left, EVENT_READ, None)
    with pytest.raises(KeyError):
        poller.unregister(left)
    poller.register(left, EVENT_READ, None)
    with pytest.raises(KeyError):
        poller.register(left, EVENT_WRITE, None)


def test_a_timeout_waits_at_least_that_long(poller, pair):
    left, _ = pair
    poller.register(left, EVENT_READ, "left")
    for timeout in (0.0015, 0.02):  # below and above epoll's millisecond: rounded up, not down
        start = time.monotonic()
        assert poller.select(timeout) == []
        assert time.monotonic() - start >= timeout
    assert poller.select(-1) == []  # a deadline already past: a look, no wait


def test_many_sockets_ready_at_once_all_come_back(poller):
    pairs = [socket.socketpair() for _ in range(8)]
    try:
        for index, (left, right) in enumerate(pairs):
            poller.register(left, EVENT_READ, index)
            right.send(b"x")
        ready = poller.select(T)
        assert sorted(data for data, _ in ready) == list(range(8))
        assert {mask for _, mask in ready} == {EVENT_READ}
    finally:
        for left, right in pairs:
            left.close()
            right.close()


@pytest.fixture(params=[pytest.param(True, id="eventfd"), pytest.param(False, id="socketpair")])
def wake_up(request):
    if request.param and not hasattr(os, "eventfd"):
        pytest.skip("no eventfd on this platform")
    wake_up = WakeUp(eventfd=request.param)
    yield wake_up
    wake_up.close()


def test_a_wake_up_from_another_thread_ends_a_wait_and_drains(poller, wake_up):
    poller.register(wake_up, EVENT_READ, "wake")
    assert poller.select(0) == []
    signaller = threading.Thread(target=wake_up.signal)
    started = time.monotonic()
    signaller.start()
    assert poller.select(T) == [("wake", EVENT_READ)]
    signaller.join()
    assert time.monotonic() - started < T
    for _ in range(3):  # signals add up; one drain takes them all
        wake_up.signal()
    wake_up.drain()
    assert poller.select(0) == []
    poller.unregister(wake_up)


def test_a_closed_wake_up_ignores_signals_and_drains(wake_up):
    wake_up.close()
    wake_up.signal()
    wake_up.drain()
    wake_up.close()  # twice is harmless
