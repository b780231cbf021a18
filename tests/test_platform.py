"""What netq does on platforms the suite does not run on, checked here on Linux.

Windows has no ``socket.sendmsg`` and no ``AF_UNIX`` in CPython (README, "Platforms"): the
byte-stream transport then writes the core's buffers one ``send`` at a time, and
``Protocol.UNIX`` says it is unavailable instead of failing somewhere inside. The sockets are
real; only the platform's answer to "is sendmsg there?" is changed, and a sendmsg call would
fail the test.
"""

from __future__ import annotations

import socket

import pytest

import netq as nq
from netq.transports import sockets

T = 30.0  # seconds any single blocking step may take before the test is considered stuck


def _no_sendmsg(*args, **kwargs):
    pytest.fail("sendmsg was called on a platform that has none")


@pytest.mark.parametrize("transport", ["tcp", "unix"], indirect=True)
def test_without_sendmsg_every_message_arrives_intact(transport, monkeypatch):
    monkeypatch.setattr(sockets, "GATHER_WRITES", False)
    monkeypatch.setattr(socket.socket, "sendmsg", _no_sendmsg)
    server = transport.make_server()
    client = transport.connect(server)
    # Small messages (coalesced by the core), and large ones whose pickle 5 out-of-band buffers
    # are separate parts of one message (several buffers per write).
    small = [i.to_bytes(4, "little") * 16 for i in range(2000)]
    large = [(bytearray(b"a" * (3 << 20)), b"mid", bytearray(b"z" * (1 << 20) + b"end"))
             for _ in range(3)]
    futures = [client.put(item) for item in small + large]
    for future in futures:
        future.result(timeout=T)
    received = [server.get(timeout=T).data for _ in range(len(futures))]
    assert received[:len(small)] == small
    assert received[len(small):] == large
    server.put(b"back", client.id).result(timeout=T)
    assert client.get(timeout=T).data == b"back"


def test_unix_without_af_unix_is_a_clear_unsupported_protocol(monkeypatch, tmp_path):
    monkeypatch.delattr(socket, "AF_UNIX")
    options = nq.CommunicatorOptions(netloc=nq.NetworkLocation(path=str(tmp_path / "s")))
    with pytest.raises(nq.UnsupportedProtocol, match="Protocol.TCP on 127.0.0.1"):
        nq.new(nq.Protocol.UNIX, nq.Purpose.SERVER, options)
