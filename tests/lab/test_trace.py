"""netq.lab.trace.Recorder: a recording relay between real communicators on loopback."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET

import pytest

import netq as nq
from netq.lab.trace import (
    CLIENT_TO_SERVER,
    SERVER_TO_CLIENT,
    Recorder,
    _Splitter,
    describe,
    html_table,
    sequence_svg,
)
from netq.protocol import frames
from netq.protocol.frames import FrameType

KEY = b"trace-test-key"


def _options(netloc, **connection):
    return nq.CommunicatorOptions(netloc=netloc, security=nq.SecurityOptions(authkey=KEY),
                                  connection=nq.ConnectionOptions(**connection))


def _types(rows, link, direction):
    return [row.type for row in rows if row.link == link and row.direction == direction]


def test_handshake_data_ack_credit_and_bye_in_order():
    server = nq.new(purpose=nq.Purpose.SERVER,
                    options=_options(nq.NetworkLocation("127.0.0.1", 0), recv_budget=64 * 1024))
    with server, Recorder(server.address) as recorder:
        client = nq.new(options=_options(recorder.netloc))
        payloads = [bytes([i]) * 30_000 for i in range(4)]  # 4 x 30 KB > the 64 KiB window
        futures = [client.put(p) for p in payloads]
        assert [server.get(timeout=20).data for _ in payloads] == payloads
        for future in futures:
            future.result(timeout=20)
        client.close(timeout=20)
        rows = recorder.wait_for(
            lambda rows: rows if _types(rows, 0, SERVER_TO_CLIENT)[-1:] == [FrameType.BYE]
            else None)
    up = _types(rows, 0, CLIENT_TO_SERVER)
    down = _types(rows, 0, SERVER_TO_CLIENT)
    assert up[:3] == [FrameType.HELLO, FrameType.AUTH, FrameType.SESSION]
    assert down[:3] == [FrameType.HELLO, FrameType.AUTH, FrameType.SESSION]
    assert up[-1] == FrameType.BYE and down[-1] == FrameType.BYE
    hello = next(r for r in rows if r.direction == CLIENT_TO_SERVER)
    assert hello.fields["role"] == "CLIENT" and hello.fields["id"] == str(client.id)
    assert hello.fields["auth"] is True and len(hello.raw) == hello.size == 16 + 64
    server_hello = next(r for r in rows if r.direction == SERVER_TO_CLIENT)
    assert server_hello.fields["recv_window"] == 64 * 1024
    data = [r for r in rows if r.type is FrameType.DATA]
    assert [r.fields["seq"] for r in data] == [1, 2, 3, 4]
    # 30 KB of bytes is pickled in band (under copy_threshold): one part, one chunk each.
    assert all(r.fields["body"] == r.fields["total"] > 30_000 and len(r.fields["parts"]) == 1
               for r in data)
    assert all(r.delivered for r in rows)
    # Each DATA is acknowledged after it was seen. A message may start while credit is
    # positive: of 64 KiB, three 30 KB messages start (the third overdraws), the fourth waits
    # until the server granted more.
    for row in data:
        assert any(a.type is FrameType.ACK and a.value >= row.value and a.index > row.index
                   for a in rows)
    credits = [r for r in rows if r.type is FrameType.CREDIT]
    assert credits and credits[0].fields["bytes"] > 0
    assert data[2].index < credits[0].index < data[3].index
    assert data[0].summary.startswith("DATA seq=1 FIRST|LAST ")
    assert html_table(rows).count("<tr>") == len(rows) + 1  # + the header row
    arrows = ET.fromstring(sequence_svg(rows)).findall(
        "{http://www.w3.org/2000/svg}line[@marker-end]")
    assert len(arrows) == len(rows)


def test_cut_and_resume_resends_only_what_was_lost():
    server = nq.new(purpose=nq.Purpose.SERVER,
                    options=_options(nq.NetworkLocation("127.0.0.1", 0)))
    with server, Recorder(server.address) as recorder:
        client = nq.new(options=_options(recorder.netloc))
        with client:
            client.put(b"before").result(timeout=20)
            assert server.get(timeout=20).data == b"before"
            recorder.stall()
            lost = [client.put(f"lost-{i}") for i in range(3)]
            recorder.wait_for(lambda rows: any(r.type is FrameType.DATA and not r.delivered
                                               for r in rows))
            recorder.cut()
            for future in lost:
                future.result(timeout=20)
            got = [server.get(timeout=20).data for _ in lost]
            with pytest.raises(nq.Empty):
                server.get(timeout=0.3)
        rows = recorder.frames()
    assert got == ["lost-0", "lost-1", "lost-2"]
    assert recorder.links == 2
    sessions = {(r.link, r.direction): r.fields for r in rows if r.type is FrameType.SESSION}
    assert sessions[1, SERVER_TO_CLIENT]["resumed"] is True
    assert sessions[1, SERVER_TO_CLIENT]["token"] == sessions[0, SERVER_TO_CLIENT]["token"]
    last = sessions[1, SERVER_TO_CLIENT]["last_received"]
    assert last == 1
    undelivered = [r for r in rows if r.type is FrameType.DATA and not r.delivered]
    second_link = [r for r in rows if r.type is FrameType.DATA and r.link == 1
              and r.direction == CLIENT_TO_SERVER]
    assert undelivered and all(r.link == 0 for r in undelivered)
    assert [r.value for r in second_link] == [2, 3, 4]
    # What was lost on the first link goes again, byte for byte, under the same numbers.
    for old in undelivered:
        again = next(r for r in second_link if r.value == old.value)
        assert again.raw[16:] == old.raw[16:]
    # Every frame in flight at the cut is shown lost: the lost DATA, and any ACK or CREDIT
    # that was on its way at that moment.
    lost_rows = [r for r in rows if not r.delivered]
    assert all(row in lost_rows for row in undelivered)
    assert html_table(rows).count("LOST") == len(lost_rows)
    assert sequence_svg(rows).count('stroke="#b00"') == len(lost_rows)


def test_splitter_cuts_frames_at_any_split_and_keeps_a_prefix():
    hello = frames.encode_hello(frames.Hello(
        frames.VERSION, frames.Role.CLIENT, False, __import__("uuid").uuid4(), bytes(16),
        1 << 20, 1 << 16, 1 << 20, frames.UNLIMITED_MESSAGES))
    body = bytes(range(256)) * 40
    descriptor = frames.encode_descriptor(len(body), [len(body) | frames.READONLY_BIT])
    data = frames.encode_header(FrameType.DATA, 3, len(descriptor) + len(body), 7) \
        + descriptor + body
    ack = frames.encode_header(FrameType.ACK, 0, 0, 7)
    stream = hello + data + ack
    whole = _Splitter(keep=100).feed(memoryview(stream))
    splitter = _Splitter(keep=100)
    pieces = [found for i in range(len(stream))
              for found in splitter.feed(memoryview(stream[i:i + 1]))]
    assert whole == pieces
    assert [h[0] for h, _, _ in whole] == [FrameType.HELLO, FrameType.DATA, FrameType.ACK]
    assert [end for _, _, end in whole] == [len(hello), len(hello) + len(data), len(stream)]
    assert whole[1][1] == data[:16 + 100]  # header + the kept 100 payload bytes
    fields = describe(FrameType.DATA, 3, 7, whole[1][1][16:], len(data) - 16)
    assert fields["total"] == len(body) and fields["parts"] == [len(body)]
    assert fields["readonly"] == [True] and fields["flags"] == "FIRST|LAST"
    assert fields["body"] == len(body)
    garbage = _Splitter(keep=100)
    assert garbage.feed(memoryview(b"\x16\x03\x01" + bytes(40))) == [] and garbage.broken


def test_an_unreachable_upstream_refuses_the_client_and_close_releases_everything():
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with Recorder(("127.0.0.1", port)) as recorder:
        with socket.create_connection(recorder.netloc[:2], timeout=5) as sock:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the recorder: no server behind it
    assert recorder.frames() == []
    Recorder(("127.0.0.1", port)).close()  # never started: still closes its sockets
