"""Packet loss for a relayed link: the kernel's netem on a veth pair into a network namespace.

A byte relay cannot lose packets (TCP below it repairs every loss), so :class:`NetemLink` makes
the loss real: it puts the listening socket of a :class:`netq.lab.relay.Relay` in a network
namespace joined to this one by a veth pair with ``netem`` (loss, delay) on both ends. Clients
connect across the veth, where netem drops and delays their packets. Needs root, ``ip`` and
``tc``: :func:`netem_unavailable` (and :func:`namespaces_unavailable`, for a pair without
netem) say why not when they are missing; nothing outside the namespaces it makes is touched.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import socket
import subprocess

from .._threads import call_on_thread
from ..options import NetworkLocation
from .relay import Relay, RelayStats

__all__ = ("NetemLink", "netem_unavailable", "namespaces_unavailable")

_NETEM_REASON: list[str | None] = []  # the probe's answer, once
_CLONE_NEWNET = 0x40000000
_counter = itertools.count()
# RFC 2544's benchmarking range: never routed, so a /30 of it cannot clash with a real network.
_BENCH_NET = ipaddress.ip_network("198.18.0.0/15")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20)


def netem_unavailable() -> str | None:
    """Why :class:`NetemLink` cannot work here, or None if it can (probed once, in a
    throwaway namespace: nothing outside it is touched)."""
    if _NETEM_REASON:
        return _NETEM_REASON[0]
    reason = None
    if os.geteuid() != 0:
        reason = "network namespaces and netem need root"
    elif not (shutil.which("ip") and shutil.which("tc")):
        reason = "iproute2 (`ip`, `tc`) is not installed"
    else:
        name = f"netq-probe-{os.getpid()}"
        made = _run("ip", "netns", "add", name)
        if made.returncode:
            reason = f"cannot create a network namespace: {made.stderr.strip()}"
        else:
            try:
                netem = _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo",
                             "root", "netem", "delay", "1ms", "loss", "1%")
                if netem.returncode:
                    reason = ("the kernel has no netem qdisc (sch_netem): "
                              f"{netem.stderr.strip()}")
            finally:
                _run("ip", "netns", "del", name)
    _NETEM_REASON.append(reason)
    return reason


def namespaces_unavailable() -> str | None:
    """Why a namespace with a veth pair (no netem) cannot be made here, or None."""
    reason = netem_unavailable()
    if reason is None or reason.startswith("the kernel has no netem"):
        return None
    return reason


def _in_namespace(name: str, make):
    """``make()`` run on a short-lived thread that joined network namespace ``name``: the
    sockets it creates live there; no other thread changes namespace."""
    import ctypes

    def run():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        return make()

    return call_on_thread(run, "netq-netns")


class NetemLink:
    """A relay whose clients cross a veth pair shaped by the kernel's netem (loss, delay).

    Makes a network namespace ``netq-<pid>-<n>`` joined to this one by a veth pair with two
    addresses of a /30 in 198.18.0.0/15 (the benchmarking range, never routed), puts netem (``loss``
    as a fraction, ``delay`` one way in seconds) on both ends, and a :class:`Relay` (forwarding to
    ``upstream`` on loopback here) listening on the namespace's end; ``relay`` are keyword arguments
    for it (``rate=`` caps the link there, ``name=`` its thread). A client connecting to
    :attr:`netloc` sends real packets across the veth, where netem drops and delays them; TCP
    repairs the losses, as on a lossy edge link. ``close()`` deletes the namespace and the pair.
    Needs root, ``ip`` and ``tc``; check :func:`netem_unavailable` first. With ``loss=0, delay=0``
    no qdisc is added (only namespaces are needed).
    """

    def __init__(self, upstream, *, loss: float = 0.01, delay: float = 0.0, **relay) -> None:
        shaped = bool(loss or delay)
        reason = netem_unavailable() if shaped else namespaces_unavailable()
        if reason:
            raise OSError(f"NetemLink: {reason}")
        n = next(_counter)
        self.namespace = f"netq-{os.getpid()}-{n}"
        self._veth = f"nq{os.getpid() % 100000}v{n}"[:15]
        subnet = _BENCH_NET.network_address + ((os.getpid() * 64 + n) % (1 << 15)) * 4
        self.host_address, self.peer_address = str(subnet + 1), str(subnet + 2)
        self.relay: Relay | None = None
        self._made_namespace = False
        try:
            self._check(_run("ip", "netns", "add", self.namespace))
            self._made_namespace = True
            peer = self._veth + "p"
            ns = ("ip", "netns", "exec", self.namespace)
            self._check(_run("ip", "link", "add", self._veth, "type", "veth", "peer", "name",
                             peer))
            self._check(_run("ip", "link", "set", peer, "netns", self.namespace))
            self._check(_run("ip", "addr", "add", f"{self.host_address}/30", "dev", self._veth))
            self._check(_run("ip", "link", "set", self._veth, "up"))
            self._check(_run(*ns, "ip", "addr", "add", f"{self.peer_address}/30", "dev", peer))
            self._check(_run(*ns, "ip", "link", "set", peer, "up"))
            self._check(_run(*ns, "ip", "link", "set", "lo", "up"))
            if shaped:
                netem = ["netem"]
                if delay:
                    netem += ["delay", f"{delay * 1e6:.0f}us"]
                if loss:
                    netem += ["loss", f"{loss * 100:g}%"]
                self._check(_run("tc", "qdisc", "add", "dev", self._veth, "root", *netem))
                self._check(_run(*ns, "tc", "qdisc", "add", "dev", peer, "root", *netem))

            def listen():
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((self.peer_address, 0))
                sock.listen(64)
                return sock

            listener = _in_namespace(self.namespace, listen)
            relay.setdefault("name", "netq-netem")
            self.relay = Relay(upstream, listener=listener, **relay)
        except BaseException:
            self.close()
            raise
        self.loss, self.delay = loss, delay

    @staticmethod
    def _check(done: subprocess.CompletedProcess) -> None:
        if done.returncode:
            raise OSError(f"{' '.join(done.args)}: {done.stderr.strip()}")

    @property
    def netloc(self) -> NetworkLocation:
        assert self.relay is not None
        return self.relay.netloc

    @property
    def address(self):
        assert self.relay is not None
        return self.relay.address

    def stats(self) -> RelayStats:
        assert self.relay is not None
        return self.relay.stats()

    def __enter__(self) -> NetemLink:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close the relay, then delete the veth pair and the namespace. Idempotent."""
        if self.relay is not None:
            self.relay.close()
        if self._made_namespace:
            _run("ip", "link", "del", self._veth)  # both ends go
            _run("ip", "netns", "del", self.namespace)
            self._made_namespace = False
