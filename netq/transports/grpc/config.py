"""How gRPC is set up for netq: channel and server options, TLS credentials, targets, and
what a failed connection attempt means.

Channel options: messages up to ``MESSAGE_LIMIT`` both ways, keepalive (an HTTP/2 PING after
10 s without traffic, dead after 5 s more), BDP probing, gRPC's default HTTP/2 frame size, no
gRPC retries (a lost stream is netq's to resume); a server refuses to share a taken port; a
client gets its own TCP connection (``use_local_subchannel_pool``) and netq's reconnect
backoff.
"""

from __future__ import annotations

import asyncio
import os

import grpc

from ...exceptions import AuthenticationError, ConnectionLost
from .streams import MESSAGE_LIMIT

__all__ = ("connect_timeout", "channel_options", "security_of", "server_credentials",
           "channel_credentials", "grpc_target", "connect_error", "forget_traceback")

_KEEPALIVE_MS = 10_000  # HTTP/2 PING after 10 s without traffic ...
_KEEPALIVE_TIMEOUT_MS = 5_000  # ... and the connection is dead if it is not answered in 5 s
# Fatal TLS verdicts on the client: the server is not who the trusted certificate says.
_UNTRUSTED = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed",
              "Hostname Verification Check failed", "is not in peer certificate")


def connect_timeout(connection) -> float:
    """Seconds a new channel may take to become ready (a frozen server must not hold us)."""
    return max(1.0, 3 * connection.heartbeat)


def channel_options(connection, server: bool) -> list[tuple[str, object]]:
    """gRPC options for a server (``server``) or a client channel, from ConnectionOptions."""
    options: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
        ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.bdp_probe", 1),
        # HTTP/2 frames stay at gRPC's default (16 KiB): 1 MiB frames moved 1 MiB messages
        # more slowly in bench/run.py's gRPC rows and no size faster.
        ("grpc.enable_retries", 0),  # a lost stream is netq's to resume, not gRPC's to replay
    ]
    if server:
        options += [
            ("grpc.so_reuseport", 0),  # a taken port must fail the bind, not be shared
            ("grpc.http2.min_ping_interval_without_data_ms", _KEEPALIVE_MS // 2),
            ("grpc.http2.min_time_between_pings_ms", _KEEPALIVE_MS // 2),
        ]
    else:
        reconnect_ms = max(1, int(connection.reconnect_min * 1000))
        # gRPC gives a connection attempt (TCP, TLS, HTTP/2 settings) max(backoff, its
        # "min reconnect backoff") to complete: that option is its minimum connect timeout.
        # Set to our backoff, a handshake needing more than reconnect_max (a TLS channel over
        # a 300 ms round trip) never completed. Give it what the I/O thread waits for.
        connect_ms = int(connect_timeout(connection) * 1000)
        options += [
            # One TCP connection per client communicator, even with many in one process
            # (gRPC would otherwise multiplex every channel to one target over one connection,
            # and one broken connection would take every client down at once).
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", reconnect_ms),
            ("grpc.min_reconnect_backoff_ms", max(reconnect_ms, connect_ms)),
            ("grpc.max_reconnect_backoff_ms",
             max(reconnect_ms, int(connection.reconnect_max * 1000))),
        ]
    return options


def _read_file(path) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


def forget_traceback(error: BaseException) -> None:
    """Break the cycle a caught gRPC error closes (its traceback holds the frames that hold
    the call and the channel), so they are freed now rather than at the next garbage
    collection: gRPC's process-wide poller (a thread, sockets) lives as long as they do."""
    current: BaseException | None = error
    for _ in range(8):  # the chain of causes is short; never loop on a malformed one
        if current is None:
            return
        current.__traceback__ = None
        current = current.__context__ or current.__cause__


def security_of(options):
    """The TLS settings of ``options``, or None for a plain channel."""
    security = options.security
    return security if security is not None and security.tls else None


def server_credentials(security):
    """The server's certificate and key; with ``client_ca``, client certificates required."""
    client_ca = _read_file(security.client_ca)
    return grpc.ssl_server_credentials(
        [(_read_file(security.key), _read_file(security.certificate))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None)


def channel_credentials(security):
    """Trust ``certificate``; present ``client_certificate``/``key`` when given."""
    client_certificate = _read_file(security.client_certificate)
    return grpc.ssl_channel_credentials(
        root_certificates=_read_file(security.certificate),
        private_key=_read_file(security.key) if client_certificate is not None else None,
        certificate_chain=client_certificate)


def grpc_target(netloc) -> str:
    """The gRPC target of ``netloc``: ``host:port`` (IPv6 in brackets) or ``unix:path``."""
    if netloc.path is not None:
        return f"unix:{os.fspath(netloc.path)}"
    host = f"[{netloc.host}]" if ":" in netloc.host else netloc.host
    return f"{host}:{netloc.port}"


def connect_error(failure: TimeoutError | grpc.aio.AioRpcError
                  ) -> ConnectionLost | AuthenticationError:
    """The netq error for a failed connection attempt (an untrusted server is fatal)."""
    if isinstance(failure, asyncio.TimeoutError):
        return ConnectionLost(None, "gRPC: the server did not answer")
    text = f"{failure.details()} {failure.debug_error_string()}"
    if any(marker in text for marker in _UNTRUSTED):
        return AuthenticationError(
            f"TLS: the server's certificate is not trusted: {failure.details()}")
    return ConnectionLost(None, f"gRPC: {failure.code().name}: {failure.details()}")
