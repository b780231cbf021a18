"""What a byte-stream link that failed to open says (netq/transports/connection_failures.py):
a storm of failed TLS handshakes is summarized, not logged line by line."""

from __future__ import annotations

import pytest

import netq as nq
from netq_testing import wait_for

T = 30.0  # seconds a blocking step may take before the test counts as stuck

pytestmark = pytest.mark.timeout(90)


def test_a_storm_of_failed_tls_handshakes_is_summarized_not_logged_line_by_line(tls_files,
                                                                                 caplog):
    """Clients that give up during the TLS handshake (here: connect and close at once, as
    clients of a storm do) fail theirs by the dozen: the server says the first one in its own
    WARNING line and counts the rest into one summary line per 5 s, and keeps serving."""
    import logging
    import socket

    caplog.set_level(logging.WARNING, logger="netq")
    security = nq.SecurityOptions(key=tls_files.server_key, certificate=tls_files.server_cert)
    server = nq.new(nq.Protocol.TCP, nq.Purpose.SERVER, nq.CommunicatorOptions(
        netloc=nq.NetworkLocation("127.0.0.1", 0), security=security,
        connection=nq.ConnectionOptions(heartbeat=0.5)))
    try:
        for _ in range(30):
            sock = socket.create_connection(server.address[:2])
            sock.sendall(b"\x16\x03\x01\x00\x05hello")  # a TLS record header, then garbage
            sock.close()

        def lines() -> list[str]:
            return [record.getMessage() for record in caplog.records
                    if "TLS handshake" in record.getMessage()]

        wait_for(lambda: any("more TLS handshake(s) failed" in text for text in lines()), T)
        said = lines()
        assert len(said) == 2, said  # the first failure, then one summary of the others
        assert said[0].startswith("netq server: TLS handshake with ") and "failed" in said[0]
        assert "29 more TLS handshake(s) failed" in said[1], said[1]
        client = nq.new(nq.Protocol.TCP, nq.Purpose.CLIENT, nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(*server.address[:2]),
            security=nq.SecurityOptions(certificate=tls_files.ca)))
        try:
            client.put("still served").result(T)
            assert server.get(timeout=T).data == "still served"
        finally:
            client.close(timeout=5)
    finally:
        server.close(timeout=5)
