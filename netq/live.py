"""The communicators of this process still referenced: a weak registry, in creation order.

:mod:`netq.communicator` registers every communicator it makes; the kernel-wide dashboard
(``netq.widgets.dashboard``) lists them, and a forked child marks the ones it inherited as
unusable (``netq.communicator._mark_inherited_after_fork``, through :func:`inherited_at_fork`).
Nothing here keeps one alive, and this module imports nothing of netq at run time: what reads
the registry (the widgets, which netq.communicator's display hooks import) need not import
netq.communicator, so no import circle goes through them.
"""

from __future__ import annotations

import itertools
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .statistics import CommunicatorStatistics

__all__ = ("LiveCommunicator", "register", "live_communicators", "count",
           "inherited_at_fork", "name_of")


class LiveCommunicator(Protocol):
    """What a reader of the registry may use: a communicator's id and its statistics."""
    id: uuid.UUID

    def statistics(self) -> CommunicatorStatistics: ...


# Each one with its rank of registration (the order of creation). The lock guards iteration
# against a concurrent registration (a weak dictionary's iterator is Python code).
_registered: weakref.WeakKeyDictionary[LiveCommunicator, int] = weakref.WeakKeyDictionary()
_ranks = itertools.count()
_lock = threading.Lock()


# Ids of this process's communicators that were given a name (CommunicatorOptions.name), for
# the messages that would print the id; an entry goes when its communicator is collected.
_names: dict[uuid.UUID, str] = {}


def register(communicator: LiveCommunicator) -> None:
    """List ``communicator`` (weakly: until it is garbage-collected), and its name if it has
    one (``communicator.options.name``)."""
    with _lock:
        _registered[communicator] = next(_ranks)
    name = getattr(getattr(communicator, "options", None), "name", None)
    if name is not None:
        _names[communicator.id] = name
        weakref.finalize(communicator, _names.pop, communicator.id, None)


def name_of(peer: uuid.UUID) -> str:
    """What a message calls ``peer``: the name of this process's communicator with that id,
    where it was given one, else the id itself."""
    return _names.get(peer) or str(peer)


def live_communicators() -> list[LiveCommunicator]:
    """The communicators of this process that are still referenced, oldest first (open or
    closed: a closed one stays listed until it is garbage-collected)."""
    with _lock:
        found = list(_registered.items())
    return [communicator for communicator, _ in sorted(found, key=lambda item: item[1])]


def count() -> int:
    """How many are listed (without the lock: a length, read at once)."""
    return len(_registered)


def inherited_at_fork() -> list[LiveCommunicator]:
    """Every one listed, read without the lock: for a hook that runs in a forked child right
    after ``os.fork()``, with only the forking thread alive (nothing can change the registry
    then, and a lock another thread of the parent held at the fork would never be released)."""
    return list(_registered)
