"""netq.protocol.events: the link's states and the events the core reports, the package's
exports the same objects."""

from __future__ import annotations

import dataclasses

import netq.protocol as package
from netq.exceptions import RemoteProtocolError
from netq.protocol import connection, events


def test_the_package_exports_the_event_classes_and_the_core_does_not_re_export_them():
    for name in events.__all__:
        assert getattr(package, name) is getattr(events, name)
        assert name not in connection.__all__


def test_events_are_slotted_dataclasses_and_compare_by_value():
    failed = events.ConnectionFailed(RemoteProtocolError("x"))
    assert not hasattr(failed, "__dict__")
    assert dataclasses.astuple(events.PongReceived(5)) == (5,)
    assert events.PongReceived(5) == events.PongReceived(5) != events.PongReceived(6)


def test_the_per_message_events_are_tuples_equal_only_to_their_own_class():
    # MessageReceived and AckReceived are made by tuple.__new__ on the hot path: no __dict__,
    # equal by class and value, never to a plain tuple or another event with the same fields.
    assert events.AckReceived(3) == events.AckReceived(3) != events.AckReceived(4)
    assert events.AckReceived(3) != (3,)
    assert events.AckReceived(3) != events.PongReceived(3)
    message = events.MessageReceived(1, False, [b"a"], 1)
    made = tuple.__new__(events.MessageReceived, (1, False, [b"a"], 1))
    assert made == message and not made != message
    assert (made.seq, made.batch, made.parts, made.size) == (1, False, [b"a"], 1)
    assert not hasattr(message, "__dict__")
    assert isinstance(message, events.Event) and isinstance(events.AckReceived(1), events.Event)


def test_states():
    assert [state.value for state in events.ConnectionState] == [
        "hello", "auth", "session", "open", "closed"]
