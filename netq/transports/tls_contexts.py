"""TLS contexts, made once per process for each set of certificate files.

Making an :class:`ssl.SSLContext` and loading a CA file into it costs about as much CPU as a
whole TCP connection's netq handshake, and a fleet's process that opens a thousand client
communicators with the same :class:`~netq.options.SecurityOptions` would pay it a thousand
times. A context is safe to share between communicators and threads once it is set up (netq
never changes one afterwards), so contexts are kept here, keyed by the role, the file paths
and each file's identity (device, inode, size, modification time): a rotated certificate
(a new file, or the same file rewritten) makes a new context, and a communicator opened
after the rotation uses it.

At most :data:`KEPT` contexts are kept, the least recently used dropped first; a
communicator holds its own reference, so dropping one here never affects a live link.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections import OrderedDict

from ..options import SecurityOptions

__all__ = ("KEPT", "tls_context")

KEPT = 16  # contexts kept per process (distinct certificate sets in use at once)

_FileIdentity = tuple[str, int, int, int, int] | None
_Key = tuple[bool, tuple[_FileIdentity, ...]]

_lock = threading.Lock()
_kept: OrderedDict[_Key, ssl.SSLContext] = OrderedDict()


def _identity(path: os.PathLike[str] | str | None) -> _FileIdentity:
    if path is None:
        return None
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except OSError:  # missing or unreadable: loading it below raises the error the user sees
        return (name, -1, -1, -1, -1)
    return (name, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _make(server: bool, security: SecurityOptions) -> ssl.SSLContext:
    assert security.certificate is not None
    if server:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(security.certificate, security.key)
        # No TLS 1.3 session tickets: netq clients do not resume TLS sessions (a netq session
        # outlives its links by itself), and making and sending two tickets per handshake is
        # work a storm of clients multiplies.
        context.num_tickets = 0
        if security.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(security.client_ca)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(security.certificate)
        if security.client_certificate is not None:
            context.load_cert_chain(security.client_certificate, security.key)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def tls_context(server: bool, security: SecurityOptions) -> ssl.SSLContext:
    """The context for a server's or a client's ``security`` (``security.certificate`` set):
    the one made before for the same files, unchanged since, or a new one. Errors loading the
    files (missing, unreadable, a key that does not match) raise from here, every time."""
    files = (security.certificate, security.key, security.client_certificate,
             security.client_ca)
    key: _Key = (server, tuple(_identity(path) for path in files))
    with _lock:
        context = _kept.get(key)
        if context is not None:
            _kept.move_to_end(key)
            return context
    context = _make(server, security)  # outside the lock: loading files may take a while
    with _lock:
        _kept[key] = context
        _kept.move_to_end(key)
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return context


def forget() -> None:
    """Drop every kept context (tests; a process that wants its files read again)."""
    with _lock:
        _kept.clear()
