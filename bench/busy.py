"""``--busy N`` for the benches: N pure-Python busy loops beside a run (bench/run.py, storm.py).

A claim about speed holds on a machine that does other work too; these loops stand for it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class BusyLoops:
    """``--busy N``: N pure-Python busy loops, one process each, for the whole run.

    Stopped when the run ends, however it ends (main()'s ``finally``; SIGTERM is turned into
    SystemExit there); each loop also exits by itself within milliseconds once its parent
    is gone, so even a SIGKILLed orchestrator leaves none behind."""

    SCRIPT = ("import os, sys\n"
              "parent = int(sys.argv[1])\n"
              "while os.getppid() == parent:\n"
              "    for _ in range(200_000):\n"
              "        pass\n")

    def __init__(self, count: int, log: Callable[[str], None] = _to_stderr) -> None:
        self.count = count
        self.log = log
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        try:
            for _ in range(self.count):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", self.SCRIPT, str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True))
        except BaseException:
            self.stop()
            raise
        if self.procs:
            self.log(f"busy: {self.count} busy-loop process(es) running: "
                + " ".join(str(p.pid) for p in self.procs))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.log(f"busy loop {p.pid} did not exit after SIGKILL")
        self.procs = []
