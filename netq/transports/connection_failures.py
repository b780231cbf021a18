"""What a byte-stream link that failed to open says: a server's failed TLS handshakes, at a
bounded rate (:class:`FailedHandshakes`), and a client's failed ``connect()`` as a sentence
(:func:`connect_error`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time

from ..options import NetworkLocation

__all__ = ("FailedHandshakes", "address_taken", "connect_error")

LOGGER = logging.getLogger("netq")
_FAILURE_SUMMARY_EVERY = 5.0  # seconds between a server's summaries of failed TLS handshakes


def address_taken(host: str, port: int) -> OSError:
    """A server's bind found ``host``:``port`` taken: an OSError (EADDRINUSE, as the bind
    raised) whose text names the address and the ways out. In a notebook the other server is
    often this kernel's own, from a cell run before (every server defaults to port 51966)."""
    where = NetworkLocation(host, port)
    return OSError(errno.EADDRINUSE,
                   f"{where} is taken: another server listens there (maybe one this process "
                   f"made earlier and has not closed); close it, or listen on port 0 "
                   f"(NetworkLocation(port=0)) and read the port it got from server.address")


class FailedHandshakes:
    """A server's failed TLS handshakes, said at a rate that does not grow with a storm: the
    first one in its own WARNING line, the ones that follow within
    :data:`_FAILURE_SUMMARY_EVERY` seconds counted into one summary line (clients that give up
    a handshake under load fail theirs by the thousand)."""

    __slots__ = ("next_line_at", "since", "count", "left", "last")

    def __init__(self) -> None:
        self.next_line_at = 0.0  # monotonic time before which failures are only counted
        self.since = 0.0
        self.count = 0  # counted, not said yet
        self.left = 0  # of them: the peer had closed or reset the connection
        self.last = ""

    def failed(self, text: str, peer_left: bool) -> None:
        now = time.monotonic()
        if not self.count and now >= self.next_line_at:
            LOGGER.warning("netq server: %s", text)
            self.next_line_at = now + _FAILURE_SUMMARY_EVERY
            return
        if not self.count:
            self.since = now
        self.count += 1
        self.left += peer_left
        self.last = text

    def summarize(self) -> None:
        """Say what was counted, once its interval is over (called every turn of the loop)."""
        now = time.monotonic()
        if not self.count or now < self.next_line_at:
            return
        LOGGER.warning(
            "netq server: %d more TLS handshake(s) failed in %.0f s, %d of them with peers that "
            "closed or reset the connection during it (clients that gave up: a storm, or a "
            "client that does not trust this certificate); the last: %s",
            self.count, now - self.since, self.left, self.last)
        self.count = self.left = 0
        self.next_line_at = now + _FAILURE_SUMMARY_EVERY


def connect_error(code: int, family: int) -> str:
    """A connect() errno as a sentence that says what it means for a netq client: "refused"
    only when the kernel said so (ECONNREFUSED: a reset in answer to our SYN, or no socket
    listening on the file)."""
    text = os.strerror(code).lower()
    if code == errno.ECONNREFUSED:
        return f"{text} (nothing listens there: is the server running, on this port?)"
    if code in (errno.ENOENT,):
        return f"{text} (no socket file: is the server running?)"
    if code in (errno.EAGAIN, errno.EWOULDBLOCK):
        if family == socket.AF_UNIX:
            return (f"{text} (the server's queue of connections to accept is full: it is busy "
                    f"accepting others)")
        return f"{text} (no free local port for another connection)"
    if code in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{text} (the host does not answer)"
    return text
