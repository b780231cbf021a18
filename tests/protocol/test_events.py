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
    assert events.AckReceived(3) == events.AckReceived(3) != events.AckReceived(4)
    message = events.MessageReceived(1, False, [b"a"], 1)
    assert dataclasses.astuple(message) == (1, False, [b"a"], 1)
    assert isinstance(message, events.Event)


def test_states():
    assert [state.value for state in events.ConnectionState] == [
        "hello", "auth", "session", "open", "closed"]
