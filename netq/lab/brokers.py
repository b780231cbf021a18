"""MQTT brokers for tests, demos and notebooks: a private mosquitto, or the one named by
``$NETQ_MQTT_BROKER``. (The MQTT *transport* is :mod:`netq.transports.mqtt`.)

    from netq.lab.brokers import local_broker

    with local_broker() as broker:                  # mosquitto on a free loopback port
        options = nq.CommunicatorOptions(netloc=broker.netloc)
        with nq.new(nq.Protocol.MQTT, nq.Purpose.SERVER, options) as server:
            ...

:func:`local_broker` writes a mosquitto configuration into a private directory, starts
``mosquitto -c <conf>`` in the foreground on ``127.0.0.1:<free port>``, waits until it accepts
connections and stops it by its pid (SIGTERM, then SIGKILL). When the binary is missing it
raises :class:`netq.BrokerUnavailable` saying how to install it. The broker keeps nothing on
disk (``persistence false``) and its log goes to ``<directory>/mosquitto.log``.

Broker limits worth knowing (mosquitto 2.0): ``max_inflight_messages`` (20) and
``max_queued_messages`` (1000) per subscriber; past them the broker *drops* QoS 1 messages
while the publisher still gets its PUBACK. netq's MQTT transport numbers its packets and
bounds what it has in the broker, so a drop costs a reconnect and a resend, never a message
(see :mod:`netq.transports.mqtt.link`).

:class:`AmqttBroker` runs amqtt (pure Python, MQTT 3.1.1) the same way. RabbitMQ nodes and
clusters, which the broker tests also run netq on, are in :mod:`netq.lab.rabbitmq`.

:func:`broker`, what the notebooks and the demo use, takes the first broker it can have:
``$NETQ_MQTT_BROKER``'s, a private mosquitto, or, where mosquitto is not installed, a private
amqtt from a venv of its own that :func:`ensure_amqtt` makes once (``pip install amqtt``). A
reader without mosquitto (no root, no apt: a hosted notebook) then runs the MQTT sections on a
real broker rather than none; amqtt is slower and speaks MQTT 3.1.1 only, so the choice is
said (``report=``, and a WARNING on the ``netq.lab`` logger) with the command that installs
mosquitto.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from ..exceptions import BrokerUnavailable
from ..options import NetworkLocation

__all__ = ("LocalBroker", "local_broker", "AmqttBroker", "broker", "environment_broker",
           "find_mosquitto", "ensure_amqtt", "amqtt_venv", "free_port", "terminate",
           "BrokerProcesses", "BROKER_VARIABLE", "AMQTT_VENV_VARIABLE", "INSTALL_HINT",
           "AMQTT_VERSION")

_log = logging.getLogger("netq.lab")

BROKER_VARIABLE = "NETQ_MQTT_BROKER"  # "host:port" of a running broker (binder/start sets it)

INSTALL_HINT = ("install mosquitto: `sudo apt-get install -y mosquitto` (Debian/Ubuntu), "
                "`brew install mosquitto` (macOS), or pass binary=/path/to/mosquitto")
_SEARCH = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto",
           "/usr/local/opt/mosquitto/sbin/mosquitto")
_START_TIMEOUT = 10.0  # seconds mosquitto gets to start listening
_STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL


def find_mosquitto(binary: str | os.PathLike | None = None) -> str:
    """The mosquitto executable: ``binary``, ``$NETQ_MOSQUITTO``, ``PATH``, or the usual places."""
    candidates = [binary, os.environ.get("NETQ_MOSQUITTO"), shutil.which("mosquitto"), *_SEARCH]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.fspath(candidate)
    raise BrokerUnavailable(f"the mosquitto broker was not found; {INSTALL_HINT}")


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000  # brokers' ports are drawn at random from here up to the ephemeral range
_PORT_DRAWS = 50
_port_draw = random.Random().randrange  # its own generator: the program's random.seed() stays


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing is bound to now, for a program that binds it later.

    A broker takes seconds to bind the port it is given (RabbitMQ about 12 s), and a port from
    the kernel's ephemeral range (what ``bind(0)`` gives) can meanwhile become the local end of
    any outgoing connection on the machine. So, where the kernel says where that range starts
    (Linux), the port is drawn below it; elsewhere, or when no draw is free, ``bind(0)``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 0
    candidates = ([_port_draw(_LOWEST_PORT, ephemeral_low) for _ in range(_PORT_DRAWS)]
                  if ephemeral_low > _LOWEST_PORT + _PORT_DRAWS else [])
    for port in [*candidates, 0]:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise BrokerUnavailable(f"no free TCP port on {host}")


def terminate(process: subprocess.Popen, timeout: float) -> bool:
    """SIGTERM ``process`` and wait up to ``timeout`` seconds for it to exit: True once it
    has exited (also when it already had), False while it still runs (the caller decides
    whether to SIGKILL it, or its whole process group)."""
    if process.poll() is not None:
        return True
    try:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    except ProcessLookupError:  # it exited between poll() and the signal
        process.wait()
    return True


class BrokerProcesses(ABC):
    """What every broker here shares: a private directory (removed by :meth:`close` when it
    made one) and ``with`` = start, then close. Subclasses give ``start()`` and ``stop()``."""

    directory: Path
    _own_directory: bool

    def _use_directory(self, directory: str | os.PathLike | None, prefix: str) -> None:
        """Keep the broker's files in ``directory``, or in a new private one removed by
        :meth:`close`."""
        self._own_directory = directory is None
        self.directory = Path(directory if directory is not None
                              else tempfile.mkdtemp(prefix=prefix))
        self.directory.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    def start(self) -> Self:
        """Start the broker's processes and return once it accepts connections."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the broker's processes (idempotent)."""

    def close(self) -> None:
        """Stop the broker and remove its private directory."""
        self.stop()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()


class LocalBroker(BrokerProcesses):
    """A private mosquitto process. Start with :meth:`start` (or ``with``); stop with :meth:`stop`.

    Limits (``None``: mosquitto's default): ``max_inflight_messages`` and
    ``max_queued_messages`` per client, ``max_queued_bytes`` per client, ``max_packet_size``
    in bytes (mosquitto refuses 0; below netq's chunk size netq adapts when it speaks MQTT 5).
    TLS: ``certfile``/``keyfile`` (and ``cafile`` + ``require_certificate`` for client
    certificates) make the listener TLS-only. ``extra`` lines go into the configuration
    verbatim. ``port=0`` picks a free port; :meth:`restart` keeps the same one.
    """

    kind = "mosquitto"
    config_name = "mosquitto.conf"  # in :attr:`directory`
    log_name = "mosquitto.log"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 max_inflight_messages: int | None = None,
                 max_queued_messages: int | None = None,
                 max_queued_bytes: int | None = None,
                 max_packet_size: int | None = None,
                 certfile: str | os.PathLike | None = None,
                 keyfile: str | os.PathLike | None = None,
                 cafile: str | os.PathLike | None = None,
                 require_certificate: bool = False,
                 extra: list[str] | tuple[str, ...] = (),
                 binary: str | os.PathLike | None = None,
                 directory: str | os.PathLike | None = None) -> None:
        self.binary = find_mosquitto(binary)
        self.host = host
        self.port = port
        self.limits = {"max_inflight_messages": max_inflight_messages,
                       "max_queued_messages": max_queued_messages,
                       "max_queued_bytes": max_queued_bytes,
                       "max_packet_size": max_packet_size}
        self.tls = {"certfile": certfile, "keyfile": keyfile, "cafile": cafile}
        if (certfile is None) != (keyfile is None):
            raise ValueError("TLS needs both certfile and keyfile")
        self.require_certificate = require_certificate
        self.extra = list(extra)
        self._use_directory(directory, prefix=f"netq-{self.kind}-")
        self.process: subprocess.Popen | None = None


    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def netloc(self) -> NetworkLocation:
        """The broker's address (``path`` unset: the default service)."""
        return NetworkLocation(self.host, self.port)

    @property
    def config_path(self) -> Path:
        return self.directory / self.config_name

    @property
    def log_path(self) -> Path:
        return self.directory / self.log_name

    def command(self) -> list[str]:
        """The broker's command line."""
        return [self.binary, "-c", str(self.config_path)]

    def config(self) -> str:
        """The configuration file's text."""
        # Run as whoever we are: started as root, mosquitto would switch to the "mosquitto"
        # user and could no longer read certificates in our private directories.
        lines = [f"user {pwd.getpwuid(os.getuid()).pw_name}",
                 f"listener {self.port} {self.host}", "allow_anonymous true",
                 # Without it mosquitto writes to subscribers with Nagle on: a small packet
                 # behind another waits for a delayed ACK (40 ms round trips here).
                 "set_tcp_nodelay true",
                 "persistence false", "log_dest stderr",
                 "log_type error", "log_type warning", "log_type notice"]
        for name, value in self.limits.items():
            if value is not None:
                lines.append(f"{name} {int(value)}")
        certfile, keyfile = self.tls["certfile"], self.tls["keyfile"]
        if certfile is not None:
            assert keyfile is not None  # __init__ takes both or neither
            lines.append(f"certfile {os.fspath(certfile)}")
            lines.append(f"keyfile {os.fspath(keyfile)}")
            if self.tls["cafile"] is not None:
                lines.append(f"cafile {os.fspath(self.tls['cafile'])}")
            if self.require_certificate:
                lines.append("require_certificate true")
        lines.extend(self.extra)
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ life cycle

    def start(self) -> LocalBroker:
        if self.process is not None and self.process.poll() is None:
            return self
        fixed_port = self.port != 0
        for _attempt in range(5):
            if not fixed_port:
                self.port = free_port(self.host)
            self.config_path.write_text(self.config())
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True)
            if self._wait_listening():
                return self
            self._reap()
            if fixed_port:
                break  # the port is taken (or the config is wrong): trying again won't help
        raise BrokerUnavailable(
            f"{self.kind} did not start listening on {self.host}:{self.port}; "
            f"log {self.log_path}:\n{self._log_tail()}")

    def _wait_listening(self) -> bool:
        process = self.process
        assert process is not None  # start() has just launched it
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _reap(self) -> None:
        process = self.process
        if process is None:
            return
        if not terminate(process, _STOP_TIMEOUT):
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        self.process = None

    def stop(self) -> None:
        """Stop the broker by its pid (SIGTERM, SIGKILL after 5 s). Idempotent."""
        self._reap()

    def kill(self) -> None:
        """SIGKILL the broker (a crash): clients see their connection reset."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def restart(self, pause: float = 0.0) -> None:
        """Stop, wait ``pause`` seconds, start again on the same port."""
        self.stop()
        time.sleep(pause)
        self.start()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid is not None else "stopped"
        return f"<{type(self).__name__} {self.kind} {self.host}:{self.port} {state}>"


def local_broker(**settings) -> LocalBroker:
    """A started :class:`LocalBroker` (use it with ``with``, or call ``close()``)."""
    return LocalBroker(**settings).start()


def environment_broker() -> NetworkLocation | None:
    """The broker named by ``$NETQ_MQTT_BROKER`` (``host:port``, ``[::1]:port``), or None.

    A malformed value raises ValueError rather than silently starting another broker.
    """
    value = os.environ.get(BROKER_VARIABLE, "").strip()
    if not value:
        return None
    host, separator, port = value.rpartition(":")
    host = host.strip("[]")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"${BROKER_VARIABLE} must be host:port, got {value!r}")
    return NetworkLocation(host, int(port))


# What a private amqtt can be asked for; every other setting (limits, TLS, extra lines, a
# binary) is mosquitto's.
_AMQTT_SETTINGS = frozenset({"host", "port"})


@contextmanager
def broker(*, report: Callable[[str], object] | None = None,
           **settings) -> Iterator[NetworkLocation]:
    """A broker to talk to, as a context manager yielding its :class:`NetworkLocation`.

    Without ``settings`` and with ``$NETQ_MQTT_BROKER`` set (``binder/start`` runs a loopback
    mosquitto and sets it), that broker is used and left running. Otherwise a private
    :func:`local_broker` with these settings (limits, TLS) is started and stopped on exit:
    experiments that need special broker limits always get their own.

    Where mosquitto is not installed, a private amqtt (:class:`AmqttBroker`, made available by
    :func:`ensure_amqtt`: once per machine, ``pip install amqtt`` into a venv of its own, about
    half a minute) takes its place, when ``settings`` ask for nothing but ``host`` and
    ``port``. ``report`` (``print``, say) is called once with a sentence naming the broker
    used; the same sentence goes to the ``netq.lab`` logger, as a WARNING for amqtt. Raises
    :class:`netq.BrokerUnavailable` saying what to install when no broker can be had.
    """
    shared = None if settings else environment_broker()
    if shared is not None:
        _say(report, logging.INFO, f"MQTT broker: {shared} (${BROKER_VARIABLE})")
        yield shared
        return
    try:
        find_mosquitto(settings.get("binary"))
    except BrokerUnavailable as no_mosquitto:
        extra = sorted(set(settings) - _AMQTT_SETTINGS)
        if extra:
            raise BrokerUnavailable(f"{no_mosquitto} (the settings {', '.join(extra)} are "
                                    f"mosquitto's; amqtt cannot stand in)") from None
        try:
            script = ensure_amqtt()
        except BrokerUnavailable as no_amqtt:
            raise BrokerUnavailable(f"no MQTT broker here: {no_mosquitto}; nor could amqtt "
                                    f"stand in: {no_amqtt}") from None
        with AmqttBroker(binary=script, **settings) as private:
            _say(report, logging.WARNING,
                 f"MQTT broker: amqtt {AMQTT_VERSION} on {private.host}:{private.port} "
                 f"(mosquitto is not installed; amqtt is pure Python, MQTT 3.1.1 only and "
                 f"several times slower; for mosquitto: {INSTALL_HINT})")
            yield private.netloc
        return
    with local_broker(**settings) as private:
        _say(report, logging.INFO, f"MQTT broker: a private mosquitto on {private.host}:"
                                   f"{private.port}")
        yield private.netloc


def _say(report: Callable[[str], object] | None, level: int, sentence: str) -> None:
    _log.log(level, "%s", sentence)
    if report is not None:
        report(sentence)


# ====================================================================== amqtt

AMQTT_VERSION = "0.12.1"  # the amqtt release netq is tested with (MQTT 3.1.1 only)
AMQTT_VENV_VARIABLE = "NETQ_AMQTT_VENV"  # where ensure_amqtt() keeps amqtt's venv
_PIP_TIMEOUT = 300  # seconds pip gets to install amqtt into its venv (once per machine)


def amqtt_venv() -> Path:
    """Where :func:`ensure_amqtt` keeps amqtt: ``$NETQ_AMQTT_VENV``, else
    ``~/.cache/netq/amqtt-<version>``."""
    default = Path.home() / ".cache" / "netq" / f"amqtt-{AMQTT_VERSION}"
    return Path(os.environ.get(AMQTT_VENV_VARIABLE) or default)


def ensure_amqtt() -> str:
    """The path of an ``amqtt`` script, installing amqtt into a venv of its own first if needed
    (:func:`amqtt_venv`; amqtt's dependency pins must not touch the caller's environment).

    Installs once per machine, under a file lock, so that parallel processes install it once.
    Raises :class:`netq.BrokerUnavailable` saying why when it cannot (no ``venv`` module, pip
    cannot reach the package index)."""
    venv = amqtt_venv()
    script = venv / "bin" / "amqtt"
    marker = venv / f".netq-amqtt-{AMQTT_VERSION}"  # written last: the install finished
    if marker.exists() and os.access(script, os.X_OK):
        return str(script)
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        lock = open(venv.parent / f".amqtt-{AMQTT_VERSION}.lock", "w")
    except OSError as error:
        raise BrokerUnavailable(f"cannot make amqtt's venv at {venv}: {error}") from error
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and os.access(script, os.X_OK):
            return str(script)
        _log.warning("installing amqtt %s into %s (once per machine)", AMQTT_VERSION, venv)
        steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                  "--disable-pip-version-check", f"amqtt=={AMQTT_VERSION}"]]
        for step in steps:
            try:
                result = subprocess.run(step, capture_output=True, text=True,
                                        timeout=_PIP_TIMEOUT, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as error:
                raise BrokerUnavailable(f"{' '.join(step)}: {error}") from error
            if result.returncode:
                raise BrokerUnavailable(f"{' '.join(step)} failed: "
                                        f"{result.stderr.strip()[-800:]}")
        marker.write_text("ok\n")
    return str(script)


class AmqttBroker(LocalBroker):
    """A private amqtt broker (pure Python, MQTT 3.1.1 only) on a free loopback port.

    ``binary`` is the ``amqtt`` script of an environment that has ``amqtt`` installed: keep it
    in a virtual environment of its own (its dependency pins are not netq's), e.g.
    ``python -m venv /tmp/amqtt && /tmp/amqtt/bin/pip install amqtt==0.12.1`` and
    ``AmqttBroker(binary="/tmp/amqtt/bin/amqtt")``. Started, stopped, killed and restarted as
    :class:`LocalBroker`; its log goes to ``<directory>/amqtt.log``.
    """

    kind = "amqtt"
    config_name = "amqtt.yaml"
    log_name = "amqtt.log"

    def __init__(self, *, binary: str | os.PathLike, host: str = "127.0.0.1", port: int = 0,
                 directory: str | os.PathLike | None = None) -> None:
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise BrokerUnavailable(f"no amqtt executable at {os.fspath(binary)}; install it "
                                    f"with `pip install amqtt=={AMQTT_VERSION}` in a venv of "
                                    f"its own")
        self.binary = os.fspath(binary)
        self.host = host
        self.port = port
        self._use_directory(directory, prefix=f"netq-{self.kind}-")
        self.process = None

    def config(self) -> str:
        return (f"listeners:\n  default:\n    type: tcp\n    bind: {self.host}:{self.port}\n"
                "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
                "    allow_anonymous: true\n")
