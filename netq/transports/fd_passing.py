"""Descriptors that travel with a Unix socket's bytes (``SCM_RIGHTS``): the shared-memory
segments of ``Protocol.UNIX``. Keeping those a read brought (:func:`keep_fds`), and whether
this host can (:func:`shm_unavailable`); the carrier (:mod:`netq.transports.sockets`) reads
them with ``recvmsg_into`` and sends them with its ``sendmsg``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableSequence

from .. import _shm
from ..exceptions import RemoteProtocolError

__all__ = ("keep_fds", "FD_SPACE", "shm_unavailable")

# Room for the ancillary data of one read: MAX_FDS_PER_WRITE descriptors.
FD_SPACE = _shm.fd_space() if hasattr(socket, "CMSG_SPACE") else 0
# Plain ints: socket's MsgFlag members are enums, and each `&` with one is Python calls.
_MSG_CTRUNC = int(getattr(socket, "MSG_CTRUNC", 0))
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_RIGHTS = int(getattr(socket, "SCM_RIGHTS", 1))


def keep_fds(count: int, ancillary: list[tuple[int, int, bytes]], flags: int,
             fds: MutableSequence[int]) -> int:
    """After ``recvmsg_into([buffer], FD_SPACE)`` gave ``count`` bytes, ``ancillary`` and
    ``flags`` (the carrier's read of a Unix link takes the common case itself: no ancillary
    data, no flags): keep the descriptors that came with the bytes (SCM_RIGHTS) in ``fds``
    and return ``count``. More than one write's worth at once (the ancillary buffer
    overflowed: the kernel closed the rest), or more waiting for their DATA frames than may,
    is the peer's fault: RemoteProtocolError, every received descriptor closed."""
    for level, kind, data in ancillary:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(memoryview(data)[:usable].cast("i"))
    if flags & _MSG_CTRUNC:
        why = f"more than {_shm.MAX_FDS_PER_WRITE} descriptors with one write"
    elif len(fds) > _shm.MAX_PENDING_FDS:
        why = (f"{len(fds)} descriptors without DATA frames (at most {_shm.MAX_PENDING_FDS} "
               f"may wait for theirs)")
    else:
        return count
    while fds:
        os.close(fds.pop())
    raise RemoteProtocolError(f"shared memory: the peer sent {why}")


def shm_unavailable() -> str | None:
    """Why Unix sockets here cannot carry shared-memory segments, or None (asked once)."""
    return _shm.unavailable_cached()
