"""netq.protocol.events: the link's states and the events the core reports, importable from
every layer (the package, the core, the shared-memory side) as the same objects."""

from __future__ import annotations

import dataclasses

import netq.protocol as package
from netq.exceptions import RemoteProtocolError
from netq.protocol import connection, events


def test_the_package_and_the_core_export_the_same_event_classes():
    for name in events.__all__:
        assert getattr(connection, name) is getattr(events, name)
        assert getattr(package, name) is getattr(events, name)


def test_events_are_slotted_dataclasses_and_compare_by_value():
    failed = events.ConnectionFailed(RemoteProtocolError("x"))
    assert not hasattr(failed, "__dict__")
    assert events.AckReceived(3) == events.AckReceived(3) != events.AckReceived(4)
    message = events.MessageReceived(1, False, [b"a"], 1)
    assert dataclasses.astuple(message) == (1, False, [b"a"], 1)
    assert isinstance(message, events.Event)


def test_states():
    assert [state.value for state in events.ConnectionState] == [
        "hello", "auth", "session", "open", "closed"]
