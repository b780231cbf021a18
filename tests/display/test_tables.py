"""netq/display/tables.py: the per-peer columns, one row as numbers or text, the text table."""

from __future__ import annotations

import dataclasses
import uuid

from netq.display.tables import (
    COLUMNS,
    header_line,
    peer_fields,
    peer_values,
    text_table,
    title_state,
)

from .snapshots import PEER, row, stats, waiting_snapshot


def test_peer_fields_and_values_share_the_columns():
    fields = peer_fields(row(), {PEER: "alpha"})
    assert fields == {"peer": "alpha", "state": "connected", "queue_in": "3",
                      "queue_out": "1.20k", "msg_in": "12.3k", "mb_in": "2.50", "msg_out": "0",
                      "mb_out": "0", "memory": "1.50 KiB", "credit_in": "64.0 KiB",
                      "credit_out": "4.00 MiB"}
    values = peer_values(row())
    assert values["mb_in"] == 2.5 and values["queue_out"] == 1200 and values["memory"] == 1536
    assert list(values) == [c.key for c in COLUMNS]
    assert peer_fields(row())["peer"] == "12345678"  # no name: first 8 hex digits


def test_one_unit_convention_no_decimal_megabytes_in_the_headers():
    assert all("MB" not in column.header for column in COLUMNS)


def test_text_table():
    other = uuid.uuid4()
    snapshot = stats(row(), row(peer=other, state="disconnected"))
    text = text_table(snapshot, {PEER: "alpha", other: "bravo"})
    lines = text.splitlines()
    assert lines[0].startswith("netq server tcp on 127.0.0.1:1  open")
    assert lines[1].split()[:3] == ["peer", "state", "queue"]
    assert lines[2].startswith("alpha") and "12.3k" in lines[2] and "2.50" in lines[2]
    assert lines[3].startswith("bravo") and "disconnected" in lines[3]
    assert lines[4].startswith("total")
    short = text_table(snapshot, max_rows=1)
    assert "... and 1 more peers" in short


def test_a_waiting_peer_and_a_failed_connect_stand_out_in_the_text():
    """What statistics() says about a wait shows in the text table and its header."""
    why = "peer x has granted no credit for 6 s: its code is not calling get()"
    text = text_table(waiting_snapshot(why))
    assert f"! 12345678 waits 6 s: {why}" in text
    assert "CANNOT CONNECT: connection refused" in text.splitlines()[0]


def test_a_waiting_get_ends_the_header_and_makes_the_title_say_waiting():
    idle = dataclasses.replace(stats(row()), get_waiting="get() has waited 7 s for a <message>")
    assert header_line(idle).endswith("  get() has waited 7 s for a <message>")
    assert title_state(idle) == "waiting"  # the badge never says open then
    assert title_state(stats(row())) == "open"
    client = dataclasses.replace(stats(row(state="connecting")), purpose="client")
    assert title_state(client) == "connecting"
    assert title_state(dataclasses.replace(client, connect_error="refused")) == "cannot connect"
