"""A memory cgroup of a test's own, for child processes: what their shared memory holds.

The kernel charges a page of a memfd segment to the memory cgroup of the process that first
touched it, and uncharges it only when the last descriptor and the last mapping of it are gone.
So the ``shmem`` line of a cgroup's ``memory.stat`` says, without asking netq, whether a
surviving process still holds segments of a peer that died: the check
``tests/transports/test_shm.py`` makes of "nothing leaks" besides ``/proc/<pid>/fd``.

``MemoryCgroup.create()`` makes one below this process's own cgroup (cgroup v2, or v1's memory
hierarchy) or raises :class:`CgroupUnavailable` saying why (not root, a read-only cgroupfs, no
memory controller). Processes are moved in with :meth:`MemoryCgroup.add` before they allocate;
:meth:`MemoryCgroup.close` removes the cgroup once they have ended.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

__all__ = ("CgroupUnavailable", "MemoryCgroup")

_names = itertools.count()


class CgroupUnavailable(Exception):
    """No memory cgroup can be made here; the text says why."""


def _own_cgroup() -> tuple[Path, Path]:
    """``(mount, path below it)`` of this process's memory cgroup: v1's memory hierarchy if
    mounted, else the v2 (unified) one."""
    v1 = v2 = None
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                v1 = path
            elif number == "0" and controllers == "":
                v2 = path
    if v1 is not None and Path("/sys/fs/cgroup/memory/memory.stat").exists():
        return Path("/sys/fs/cgroup/memory"), Path(v1.lstrip("/"))
    for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = mount / "cgroup.controllers"
        if v2 is not None and controllers.exists() and "memory" in controllers.read_text():
            return mount, Path(v2.lstrip("/"))
    raise CgroupUnavailable("no memory cgroup controller is mounted (v1 memory or v2)")


class MemoryCgroup:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def create(cls) -> MemoryCgroup:
        mount, own = _own_cgroup()
        directory = mount / own / f"netq-test-{os.getpid()}-{next(_names)}"
        try:
            directory.mkdir()
        except OSError as error:
            raise CgroupUnavailable(f"cannot make a cgroup in {directory.parent}: {error}") \
                from None
        group = cls(directory)
        if not (directory / "memory.stat").exists():
            group.close()
            raise CgroupUnavailable(f"{directory.parent} does not delegate the memory "
                                    "controller to its children")
        return group

    def add(self, pid: int) -> None:
        """Move process ``pid`` in: what it allocates from now on is charged here."""
        (self.directory / "cgroup.procs").write_text(f"{pid}\n")

    def shmem(self) -> int:
        """Bytes of shared memory (memfd and tmpfs pages) charged to this cgroup."""
        for line in (self.directory / "memory.stat").read_text().splitlines():
            key, value = line.split()
            if key == "shmem":
                return int(value)
        raise CgroupUnavailable(f"{self.directory}/memory.stat has no shmem line")

    def close(self, timeout: float = 10.0) -> None:
        """Remove the cgroup once its processes have ended (they must have been reaped; the
        kernel lets the directory go a moment after the last one, hence the bounded retry)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.directory.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
