"""A private mosquitto for one MQTT measurement (stdlib only; used on Python 3.11 and 3.13).

The binding worker (receiver / echo) starts it on a free loopback port, in its own process
group, so the orchestrator's kill on a timeout takes the broker too; it reports the broker's
peak RSS (VmHWM) and CPU time with its result, and stops it by pid at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import common

INSTALL_HINT = "install mosquitto: sudo apt-get install -y mosquitto"


def _binary() -> str:
    for candidate in (os.environ.get("NETQ_MOSQUITTO"), shutil.which("mosquitto"),
                      "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(f"mosquitto not found; {INSTALL_HINT}")


class Broker:
    def __init__(self, tmpdir: str | None = None, **limits) -> None:
        self.port = common.free_port()
        directory = tempfile.mkdtemp(prefix="mosq-", dir=tmpdir)
        conf = os.path.join(directory, "mosquitto.conf")
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence false",
                 "set_tcp_nodelay true",
                 "log_dest none"]
        lines += [f"{name} {value}" for name, value in limits.items() if value is not None]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = subprocess.Popen([_binary(), "-c", conf], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError as error:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("mosquitto did not start") from error
                time.sleep(0.02)

    def stats(self) -> dict:
        """Peak RSS (KiB) and CPU seconds of the broker so far."""
        peak = None
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = int(line.split()[1])
        except OSError:
            pass
        return {"broker_peak_rss_kb": peak, "broker_cpu_s": common.proc_cpu_s(self.proc.pid)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
