"""netq.loop.ParkingSpot: where an I/O thread waits while callers lead its loop.

The parking thread sets ``parked`` under the spot's mutex before it looks for work and then
waits on the gate; ``unpark()`` releases the gate once per park. Each test bounds its waits.
"""

from __future__ import annotations

import threading
import time

from netq.loop import ParkingSpot


def park(spot: ParkingSpot, gap: float) -> bool:
    with spot.mutex:
        spot.parked = True
    return spot.wait(gap)


def test_a_park_nobody_ends_times_out_and_leaves_the_spot_unparked():
    spot = ParkingSpot()
    started = time.monotonic()
    assert park(spot, 0.02) is False
    assert time.monotonic() - started >= 0.015
    assert not spot.parked


def test_an_unpark_without_a_parked_thread_does_nothing():
    spot = ParkingSpot()
    spot.unpark()
    assert park(spot, 0.01) is False  # the earlier unpark did not leave the gate open


def test_an_unpark_ends_the_wait_at_once_and_only_that_park():
    spot = ParkingSpot()
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(park(spot, 30.0)))
    thread.start()
    deadline = time.monotonic() + 10.0
    while not spot.parked:  # bounded poll: the thread parks
        assert time.monotonic() < deadline
        time.sleep(0.001)
    spot.unpark()
    spot.unpark()  # a second one in the same park releases nothing more
    thread.join(10.0)
    assert result == [True] and not spot.parked
    assert park(spot, 0.01) is False  # the gate is locked again for the next park


def test_an_unpark_as_the_gap_ends_is_taken_and_the_gate_stays_locked():
    # unpark() between the gate's timeout and the parking thread's look under the mutex (on
    # a slow machine the release may come before the timeout instead): either way the wait
    # reports it (True) and the gate is locked again for the next park.
    spot = ParkingSpot()
    with spot.mutex:
        spot.parked = True
    spot.mutex.acquire()  # the parking thread's look after its timeout waits here
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(spot.wait(0.01)))
    thread.start()
    time.sleep(0.05)  # usually past the gap: the thread then waits for the mutex
    spot._released = True  # what unpark() does under the mutex (which this test holds)
    spot._gate.release()
    spot.mutex.release()
    thread.join(10.0)
    assert result == [True]
    assert park(spot, 0.01) is False
