"""Private RabbitMQ nodes and clusters with the MQTT plugin, for the broker tests and benches.

    from netq.lab.rabbitmq import RabbitMQCluster

    with RabbitMQCluster(2) as cluster:             # two nodes on loopback, about 25 s to boot
        netloc = cluster.nodes[0].netloc           # each node's MQTT listener

:class:`RabbitMQCluster` starts everything it needs privately (its own ``epmd``, Erlang cookie,
ports and data directory) and stops it by pid; when RabbitMQ is not installed,
:func:`find_rabbitmq` raises :class:`netq.BrokerUnavailable` saying how to install it. The
mosquitto and amqtt brokers, and :func:`netq.lab.brokers.free_port` that every broker's ports
come from, are in :mod:`netq.lab.brokers`. A node that loses a port to another program while
it boots is started again on new ones, with a warning on this module's logger.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ..exceptions import BrokerUnavailable
from ..options import NetworkLocation
from .brokers import BrokerProcesses, free_port, terminate

__all__ = ("RabbitMQCluster", "RabbitMQNode", "find_rabbitmq", "RABBITMQ_HINT",
           "RABBITMQ_START_TIMEOUT")

_logger = logging.getLogger(__name__)

RABBITMQ_HINT = ("install RabbitMQ: `sudo apt-get install -y rabbitmq-server` (Debian/Ubuntu; "
                 "the rabbitmq_mqtt plugin ships with it)")
_RABBITMQ_SEARCH = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server",
                    "/usr/local/sbin/rabbitmq-server", "/opt/homebrew/sbin/rabbitmq-server")
# What rabbitmq-server prints once every boot step has run ("... completed with N plugins.").
_BOOT_COMPLETED = b"Starting broker... completed"
_BOOT_NOTICE = 15.0  # seconds of waiting for a node after which the wait is logged (INFO)
_PORT_ATTEMPTS = 3  # starts a node gets when another program takes one of its ports
RABBITMQ_START_TIMEOUT = 90.0  # seconds a node gets to open its MQTT listener (~12 s idle)
_EPMD_START_TIMEOUT = 10.0  # seconds the cluster's epmd gets to start listening
# seconds a killed node's process group (the script and its Erlang VM) gets to be gone
_GROUP_EXIT_TIMEOUT = 5.0


def find_rabbitmq() -> tuple[str, str, str]:
    """``(rabbitmq-server, rabbitmqctl, epmd)`` executables, or :class:`BrokerUnavailable`.

    The script under ``/usr/lib/rabbitmq/bin`` comes first: ``/usr/sbin/rabbitmq-server`` is a
    wrapper that switches to the ``rabbitmq`` user, which could not read our private
    directories."""
    for candidate in _RABBITMQ_SEARCH:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            server = candidate
            break
    else:
        raise BrokerUnavailable(f"rabbitmq-server was not found; {RABBITMQ_HINT}")
    ctl = os.path.join(os.path.dirname(server), "rabbitmqctl")
    epmd = shutil.which("epmd") or "/usr/bin/epmd"
    if not (os.access(ctl, os.X_OK) and os.access(epmd, os.X_OK)):
        raise BrokerUnavailable(f"rabbitmqctl or Erlang's epmd is missing; {RABBITMQ_HINT}")
    return server, ctl, epmd


class RabbitMQNode:
    """One RabbitMQ node of a :class:`RabbitMQCluster`: its name, ports and data directory."""

    def __init__(self, cluster: RabbitMQCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"netq{cluster.tag}n{index}@localhost"
        self.choose_ports()
        self.directory = cluster.directory / f"node{index}"
        self.process: subprocess.Popen | None = None
        self._log_start = 0  # where this start's output begins in stdout.log

    def choose_ports(self) -> None:
        """Free MQTT, AMQP and distribution ports on the cluster's host (applied at the next
        :meth:`start_process`)."""
        host = self.cluster.host
        self.mqtt_port = free_port(host)
        self.amqp_port = free_port(host)
        self.dist_port = free_port(host)

    @property
    def netloc(self) -> NetworkLocation:
        """The node's MQTT listener (``path`` unset: the default service)."""
        return NetworkLocation(self.cluster.host, self.mqtt_port)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.directory / "stdout.log"

    def config(self) -> str:
        host = self.cluster.host
        lines = [f"listeners.tcp.default = {host}:{self.amqp_port}",
                 f"mqtt.listeners.tcp.default = {host}:{self.mqtt_port}",
                 "mqtt.allow_anonymous = true",
                 # Our messages are small and many: no disk alarm on a nearly full CI disk.
                 "disk_free_limit.absolute = 50MB",
                 "vm_memory_high_watermark.relative = 0.2",
                 "log.console = false", "log.file.level = warning"]
        if self.index:
            lines += ["cluster_formation.peer_discovery_backend = classic_config",
                      f"cluster_formation.classic_config.nodes.1 = {self.cluster.nodes[0].name}"]
        return "\n".join(lines) + "\n"

    def environment(self) -> dict[str, str]:
        cluster = self.cluster
        environment = dict(os.environ)
        environment.update({
            "HOME": str(cluster.home), "ERL_EPMD_PORT": str(cluster.epmd_port),
            "ERL_EPMD_ADDRESS": cluster.host,
            "RABBITMQ_NODENAME": self.name, "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_NODE_IP_ADDRESS": cluster.host,
            "RABBITMQ_NODE_PORT": str(self.amqp_port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.directory / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.directory / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.directory / "rabbitmq.pid"),
            # epmd is ours (RabbitMQCluster), stopped by its pid: the node must not start one.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-start_epmd false",
            "RABBITMQ_CTL_ERL_ARGS": "-start_epmd false",
        })
        return environment

    def start_process(self) -> None:
        """Launch the node (returns at once; :meth:`wait_ready` waits for MQTT)."""
        if self.process is not None and self.process.poll() is None:
            return
        for sub in ("mnesia", "log"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        (self.directory / "rabbitmq.conf").write_text(self.config())
        (self.directory / "advanced.config").write_text("[].\n")
        (self.directory / "rabbitmq-env.conf").write_text("")
        (self.directory / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self.process = subprocess.Popen(
                [self.cluster.binaries[0]], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=self.environment(), start_new_session=True)

    def wait_ready(self, timeout: float = RABBITMQ_START_TIMEOUT) -> None:
        """Wait until the node says it has booted and its MQTT listener accepts connections,
        or raise BrokerUnavailable.

        Both: the MQTT listener opens before the node's last boot steps (its AMQP listener
        among them), so a node can accept MQTT connections for a moment and then exit with
        ``BOOT FAILED``."""
        process = self.process
        assert process is not None  # start_process() has launched it
        started = time.monotonic()
        deadline = started + timeout
        said = False
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            if not said and time.monotonic() - started >= _BOOT_NOTICE:
                said = True
                _logger.info("waiting for RabbitMQ node %s to boot (up to %g s; its log: %s)",
                             self.name, timeout, self.log_path)
            if _BOOT_COMPLETED in self._this_start_output():
                try:
                    with socket.create_connection((self.cluster.host, self.mqtt_port),
                                                  timeout=0.5):
                        return
                except OSError:
                    pass
            time.sleep(0.1)
        raise BrokerUnavailable(
            f"RabbitMQ node {self.name} did not boot with MQTT open on {self.cluster.host}:"
            f"{self.mqtt_port} within {timeout:g} s; log {self.log_path}:\n{self._log_tail()}")

    def wait_started(self, timeout: float = RABBITMQ_START_TIMEOUT) -> None:
        """:meth:`wait_ready` after a first start. A node that exited because one of its ports
        was taken while it booted (another program bound it first) gets new ports and starts
        again (three starts in all), with a warning on the ``netq.lab.rabbitmq`` logger."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                self.wait_ready(timeout)
                return
            except BrokerUnavailable:
                if attempt == _PORT_ATTEMPTS or not self._lost_a_port():
                    raise
            taken = (self.mqtt_port, self.amqp_port, self.dist_port)
            self.stop()
            self.choose_ports()
            _logger.warning("RabbitMQ node %s exited: one of its ports %s was taken while it "
                            "started; starting it again on MQTT port %d", self.name, taken,
                            self.mqtt_port)
            self.start_process()

    def _lost_a_port(self) -> bool:
        """Whether this start ended with a listener that could not bind (``eaddrinuse``)."""
        if self.process is None or self.process.poll() is None:
            return False
        return b"eaddrinuse" in self._this_start_output()

    def _this_start_output(self) -> bytes:
        """What the node has printed since its last :meth:`start_process`."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return log.read()
        except OSError:
            return b""

    def _log_tail(self) -> str:
        texts = []
        for path in (self.log_path, *sorted((self.directory / "log").glob("*.log"))):
            try:
                texts.append(path.read_text(errors="replace")[-1500:])
            except OSError:
                pass
        return "\n".join(texts)

    def stop(self) -> None:
        """Stop the node by its pid (SIGTERM: a clean shutdown; SIGKILL after 30 s) and every
        process it started (its process group: erl_child_setup, inet_gethost)."""
        process = self.process
        if process is None:
            return
        terminate(process, 30.0)  # whether or not it exited, its helpers may still run
        _kill_group(process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL the node and its helpers (a crash)."""
        if self.process is not None:
            _kill_group(self.process)
        self.process = None

    def restart(self) -> None:
        """Stop the node, start it again with the same name, ports and data; wait for MQTT."""
        self.stop()
        self.start_process()
        self.wait_ready()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid is not None else "stopped"
        return f"<RabbitMQNode {self.name} mqtt {self.cluster.host}:{self.mqtt_port} {state}>"


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group a broker was started in (start_new_session), reap its leader
    and wait until the rest of the group is gone too (RabbitMQ's Erlang VM is a child of the
    leader script: until it is gone it holds the node's name and ports)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    deadline = time.monotonic() + _GROUP_EXIT_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


class RabbitMQCluster(BrokerProcesses):
    """Private RabbitMQ nodes with the MQTT plugin, on loopback; the nodes after the first
    start together once it has booted, and join it (``classic_config`` peer discovery). One
    node is a cluster of one: ``RabbitMQCluster(1).start().nodes[0].netloc``.

    Everything is private: an ``epmd`` on a free port (started and stopped by its pid), a HOME
    with its own ``.erlang.cookie``, per node a name, AMQP/MQTT/distribution ports on
    ``host`` only, and its data and logs under ``directory`` (removed by :meth:`close`).
    Starting takes about 12 s on an idle machine for a cluster of one, twice that for more.

    RabbitMQ 3.10 caveat: the first node of a cluster, killed with SIGKILL, does not come back
    (its MQTT plugin fails to restart its Raft member: ``badrpc, nodedown``); the other nodes,
    and a node of a cluster of one, do.
    """

    def __init__(self, size: int = 1, *, host: str = "127.0.0.1",
                 directory: str | os.PathLike | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.binaries = find_rabbitmq()
        self.host = host
        self.tag = os.urandom(3).hex()
        self._use_directory(directory, prefix="netq-rabbitmq-")
        self.home = self.directory / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex().upper())
        cookie.chmod(0o400)
        self.epmd_port = free_port(host)
        self.epmd: subprocess.Popen | None = None
        self.nodes = [RabbitMQNode(self, index) for index in range(size)]

    def start(self) -> RabbitMQCluster:
        """Start epmd and every node at once; wait until each one's MQTT listener is up."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> RabbitMQCluster:
        """Start epmd and the first node's process, without waiting for it (see
        :meth:`wait_ready`, which starts the others): clusters launched one after the other
        boot in parallel."""
        try:
            if self.epmd is None:
                environment = dict(os.environ, ERL_EPMD_ADDRESS=self.host, HOME=str(self.home))
                self.epmd = subprocess.Popen(
                    [self.binaries[2], "-port", str(self.epmd_port)], env=environment,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True)
                self._wait_epmd()
            self.nodes[0].start_process()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> RabbitMQCluster:
        """Wait until the first node has booted, then start the others and wait until each
        one has booted with its MQTT listener up (BrokerUnavailable, all stopped, if one does
        not come up).

        The others join the first one only once it has booted: a node that joins a first
        node still booting can make it fail (``incompatible_feature_flags``) or wait for
        the joiner's tables until the start timeout."""
        try:
            first, *others = self.nodes
            first.wait_started()
            for node in others:
                node.start_process()
            for node in others:
                node.wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_epmd(self) -> None:
        deadline = time.monotonic() + _EPMD_START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.epmd_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise BrokerUnavailable(f"epmd did not listen on {self.host}:{self.epmd_port}")

    def ctl(self, node: RabbitMQNode, *arguments: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <node> ...`` against one of our nodes; its output."""
        result = subprocess.run([self.binaries[1], "-n", node.name, *arguments],
                                env=node.environment(), capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        if result.returncode:
            raise BrokerUnavailable(f"rabbitmqctl {' '.join(arguments)} on {node.name} "
                                    f"failed: {result.stderr or result.stdout}")
        return result.stdout

    def running_nodes(self) -> list[str]:
        """The names of the cluster's running nodes, as the first node sees them."""
        text = self.ctl(self.nodes[0], "eval", "rabbit_nodes:all_running().")
        return sorted(name.strip(" '\n") for name in text.strip().strip("[]").split(","))

    def stop(self) -> None:
        """Stop every node, then epmd, by their pids (idempotent)."""
        for node in self.nodes:
            node.stop()
        if self.epmd is not None:
            _kill_group(self.epmd)
            self.epmd = None
