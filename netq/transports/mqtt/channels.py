"""The MQTT channel table: which links exist, and what to do with each packet that arrives.

A *channel* is one link's carrier state (:class:`Channel`): the client id and epoch naming it,
the topic its packets go to, its :class:`~netq.transports.mqtt.link.LinkState` and the flags
the I/O thread and paho's thread exchange. A server keeps one per ``(client id, epoch)``, a
client at most one (:attr:`ChannelTable.current`); send windows
(:class:`~netq.transports.mqtt.link.Window`) are kept per peer and outlive links.

Per-packet judging (paho's thread, :meth:`ChannelTable.on_packet`): a packet for an unknown
epoch opens a server channel if it is an OPEN with seq 1 (at most ``_MAX_PENDING_EPOCHS`` per
client id, so OPEN floods stay bounded), else earns a rate-limited CLOSE answer. A known
channel's packets go through ``LinkState.receive``: in-order bodies go to the engine,
duplicates are counted, a gap or an invalid ack ends the link (and tells the peer), a CLOSE
ends it quietly. A requested link ack goes out from the loop's thread a moment later
(:meth:`ChannelTable.flush_acks`), unless a packet carried it meanwhile.

The probe timer (:meth:`ChannelTable.tick`, on paho's thread through
:class:`~netq.transports.mqtt.paho_adapter.PahoClient`'s ``loop_misc``) probes links whose acks
stopped while packets are outstanding: a lost tail shows up as a gap at the receiver.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from ...exceptions import ConnectionLost
from ...options import MQTTOptions
from ...protocol.sending import Buffer
from .link import (
    ACK_REQUEST,
    GAP,
    HEADER_SIZE,
    Kind,
    LinkState,
    Verdict,
    Window,
    encode,
    parse_header,
)
from .topics import SERVER, Topics

__all__ = ("Channel", "ChannelTable", "LinkEvents", "Publish")

LOGGER = logging.getLogger("netq")
_PROBE_AFTER = 0.5  # seconds without ack progress after which a sender probes its tail
_TICK = 0.25  # seconds between probe checks on paho's thread (it passes at least every 1 s)
_MAX_PENDING_EPOCHS = 4  # links per client id not yet authenticated (bounds OPEN floods)
_CLOSE_REPLY_INTERVAL = 0.5  # seconds between CLOSE answers to one stale epoch
_OPEN, _CLOSE = int(Kind.OPEN), int(Kind.CLOSE)
# Seconds a requested link ack waits for a packet to carry it before it is published alone:
# longer than the loop holds a lone netq ACK (MQTTCarrier.ack_hold), which such a packet brings.
_LINK_ACK_DELAY = 0.002

Payload = bytes | memoryview  # a large publish arrives as a view of paho's buffer (zero-copy)
Publish = Callable[[str, bytes, int], object]
"""``publish(topic, payload, qos)``: one MQTT publish (paho's ``publish``: thread-safe)."""


class Channel:
    """One link's carrier state: which client and epoch, where its packets go, its seq state."""

    __slots__ = ("cid", "epoch", "state", "topic_out", "opened", "closed", "peer_closed",
                 "wants_wake", "published_seq", "last_probe", "servers", "ack_due",
                 "server_id")

    def __init__(self, cid: str, epoch: int, state: LinkState, topic_out: str) -> None:
        self.cid = cid
        self.epoch = epoch
        self.state = state
        self.topic_out = topic_out
        self.opened = False  # posted to the loop (channel_opened): it hears how it ends
        self.closed = False
        self.peer_closed = False
        self.wants_wake = False
        self.published_seq = 0  # highest seq handed to paho (probes never name more)
        self.last_probe = 0.0
        self.servers: frozenset[int] = frozenset()  # client: server instances online at open
        # When the peer asked for an ack that no packet has carried yet (0.0: none asked).
        self.ack_due = 0.0
        self.server_id = ""  # client: the id the server announced (before its HELLO names it)

    @property
    def instance(self) -> int:
        return self.epoch >> 32


class LinkEvents(Protocol):
    """What the channel table tells the loop (the packet carrier's thread-safe posts)."""

    def channel_opened(self, channel: Channel, address: object,
                       bound_to: str | None = None) -> None: ...

    def packet_received(self, channel: Channel, payload: Buffer) -> None: ...

    def channel_closed(self, channel: Channel, error: BaseException | None = None) -> None: ...

    def wake(self) -> None: ...


class ChannelTable:
    """The channels of an MQTT transport: opening, judging packets, acks, probes, ending.

    State owned: the channels (server: by ``(client id, epoch)``; client: :attr:`current`),
    the send windows per peer, the client's pending attempt and attempt counter, the CLOSE
    answers already given, whether link acks are due (:attr:`acks_due`), the probe timer and
    the link-layer :attr:`counters` (gaps, duplicates, stale_packets, probes, acks_sent,
    invalid_packets).

    Threads and lock: packets are judged, links opened on a server and probes sent on paho's
    thread (:meth:`on_packet`, :meth:`tick`, the presence callbacks); link acks go out on the
    loop's I/O thread (:meth:`flush_acks`), which also starts a client's attempts
    (:meth:`request_attempt`); :meth:`end` runs on any thread. ``_lock`` guards the registry:
    the channels, :attr:`current`, the windows, the pending attempt and the attempt counter.
    While holding it the table reads ``connected()`` and calls ``live_servers()`` (presence
    takes its own lock inside: the lock order is this table's, then presence's); it never
    publishes or posts to the loop while holding it. A channel's flags pass between threads
    as single attribute writes; its ``state`` has its own lock (:class:`LinkState`). Each
    counter has one writing thread (acks_sent the loop's, the others paho's).

    Received at construction: the topics, the role, our id, the MQTT options (QoS, windows),
    the address a client's links are reported with, the log's role name, and from the
    carrier: ``publish(topic, payload, qos)``, ``connected()`` (broker CONNACK'd and
    subscribed), the loop's posts (``events``: a :class:`LinkEvents`), and from presence:
    ``live_servers()`` and ``instance()`` (our broker connection's name, for epochs).
    """

    def __init__(self, topics: Topics, mqtt: MQTTOptions, *, is_server: bool, my_cid: str,
                 address: str, role: str, publish: Publish, connected: Callable[[], bool],
                 events: LinkEvents, live_servers: Callable[[], dict[int, str]],
                 instance: Callable[[], int]) -> None:
        self._topics = topics
        self._mqtt = mqtt
        self._qos = mqtt.qos
        self._is_server = is_server
        self._my_cid = my_cid
        self._address = address
        self._role = role
        self._publish = publish
        self._connected = connected
        # The loop's posts, held as bound methods (the table keeps nothing else of the carrier).
        self._post_opened = events.channel_opened
        self._post_packet = events.packet_received
        self._post_closed = events.channel_closed
        self._wake = events.wake
        self._live_servers = live_servers
        self._instance = instance
        self._lock = threading.Lock()  # the registry: see the class docstring
        self._channels: dict[tuple[str, int], Channel] = {}  # server: (cid, epoch) -> channel
        self.current: Channel | None = None  # client: the live channel (read it whole)
        self._windows: dict[str, Window] = {}  # per client id (server) or SERVER: survive links
        self._attempt_pending = False
        self._attempts = 0
        self._accepting = True  # False once the carrier refuses newcomers or stops
        self._close_replies: dict[tuple[str, int], float] = {}
        self.acks_due = False  # some channel's peer asked for a link ack (see flush_acks)
        self._last_tick = 0.0
        self.counters = {"gaps": 0, "duplicates": 0, "stale_packets": 0, "probes": 0,
                         "acks_sent": 0, "invalid_packets": 0}

    # ------------------------------------------------------------------ judging packets

    def on_packet(self, topic: str, payload: Payload) -> None:
        """A publish on a link topic (paho's thread): judge it."""
        header = parse_header(payload)
        if header is None:
            self.counters["invalid_packets"] += 1
            return
        kind, flags, epoch, seq, ack = header
        if self._is_server:
            c2s = self._topics.c2s
            if not topic.startswith(c2s):
                return
            cid = topic[len(c2s):]
            channel = self._channels.get((cid, epoch))
            if channel is None:
                if kind == _OPEN and seq == 1 and self._accepting:
                    channel = self._open_server_channel(cid, epoch)
                if channel is None:
                    self.counters["stale_packets"] += 1
                    if kind != _CLOSE:
                        self._reply_close(cid, epoch)
                    return
        else:
            channel = self.current
            if channel is None or channel.epoch != epoch or channel.closed:
                self.counters["stale_packets"] += 1
                return
        self._judge(channel, kind, flags, seq, ack, payload)

    def _open_server_channel(self, cid: str, epoch: int) -> Channel | None:
        try:
            if str(uuid.UUID(cid)) != cid:
                return None
        except ValueError:
            return None
        with self._lock:
            if sum(1 for c in self._channels.values() if c.cid == cid) >= _MAX_PENDING_EPOCHS:
                # A flood of OPENs for one id: the older links of that id must finish first.
                return None
            window = self._windows.get(cid)
            if window is None:
                window = self._windows[cid] = self._new_window()
            channel = Channel(cid, epoch, LinkState(epoch, window), f"{self._topics.s2c}{cid}")
            self._channels[(cid, epoch)] = channel
        # Bound to the client id of its topics: the peer's HELLO must name that id (no
        # impersonation through someone else's topics).
        channel.opened = True
        self._post_opened(channel, f"mqtt:{cid}", bound_to=cid)
        return channel

    def _judge(self, channel: Channel, kind: int, flags: int, seq: int, ack: int,
               payload: Payload) -> None:
        if channel.closed:
            return
        state = channel.state
        verdict, ack_now = state.receive(kind, flags, seq, ack, time.monotonic())
        if verdict is Verdict.DELIVER:
            if len(payload) > HEADER_SIZE:
                # A channel is registered before its first packet can arrive: a server opens
                # it on paho's thread, which judges its packets; a client's peer answers only
                # after the link (set once registered) has published its OPEN.
                assert channel.opened
                self._post_packet(channel, memoryview(payload)[HEADER_SIZE:])
        elif verdict is Verdict.DUPLICATE:
            self.counters["duplicates"] += 1
        elif verdict is Verdict.GAP:
            gap_range = state.gap_range
            assert gap_range is not None  # receive() sets it with every GAP verdict
            first, last = gap_range
            self.counters["gaps"] += 1
            LOGGER.warning("netq mqtt %s: gap on link %s epoch %x: packets %d..%d never "
                           "arrived (the broker dropped them); the link restarts and netq "
                           "resends from the last acknowledged message",
                           self._role, channel.cid, channel.epoch, first, last)
            self.end(channel, ConnectionLost(
                self.peer(channel), f"MQTT broker dropped link packets {first}..{last}"),
                notify=True, gap=True)
            return
        elif verdict is Verdict.CLOSED:
            channel.peer_closed = True
            if flags & GAP:
                state.window.lost()
            reason = bytes(payload[HEADER_SIZE:]).decode(errors="replace") or "closed"
            self.end(channel,
                     ConnectionLost(self.peer(channel), f"peer ended the link: {reason}"),
                     notify=False)
            return
        elif verdict is Verdict.INVALID:
            self.counters["invalid_packets"] += 1
            self.end(channel, ConnectionLost(self.peer(channel), "invalid link acknowledgement"),
                     notify=True)
            return
        if ack_now and not channel.closed:
            # Asked for an ack: let the I/O thread send it after its next pass, so that it
            # rides on the netq frames that pass produces (ACK/CREDIT) when there are any.
            if not channel.ack_due:
                channel.ack_due = time.monotonic()
            self.acks_due = True
            self._wake()
        if channel.wants_wake and state.can_send():
            channel.wants_wake = False
            self._wake()

    def _reply_close(self, cid: str, epoch: int) -> None:
        """A packet for an epoch we do not have: tell its sender (rate-limited) to move on."""
        now = time.monotonic()
        key = (cid, epoch)
        last = self._close_replies.get(key)
        if last is not None and now - last < _CLOSE_REPLY_INTERVAL:
            return
        if len(self._close_replies) > 1024:
            self._close_replies.clear()
        self._close_replies[key] = now
        header = encode(_CLOSE, 0, epoch, 0, 0)
        self._publish(f"{self._topics.s2c}{cid}", header + b"unknown link", self._qos)

    # ------------------------------------------------------------------ ending links

    def end(self, channel: Channel, error: BaseException | str, *, notify: bool,
            gap: bool = False, tell_base: bool = True) -> None:
        """The link is over (any thread): tell the peer if asked, then the base (unless the
        base is the one ending it)."""
        with self._lock:
            if channel.closed:
                return
            channel.closed = True
            if self._channels.get((channel.cid, channel.epoch)) is channel:
                del self._channels[(channel.cid, channel.epoch)]
            if self.current is channel:
                self.current = None
        if notify and self._connected():
            self._publish(channel.topic_out,
                          channel.state.close_header(gap) + str(error).encode()[:200],
                          self._qos)
        if tell_base and channel.opened:
            # A reason string comes only from the base closing the link (tell_base=False).
            assert isinstance(error, BaseException)
            self._post_closed(channel, error)

    def end_all(self, why: str) -> None:
        """The broker connection is gone (paho's thread): every link ends, unannounced."""
        for channel in self._all_channels():
            self.end(channel, ConnectionLost(self.peer(channel), why), notify=False)

    def client_left(self, cid: str, instance: int) -> None:
        """Server: that client instance's status went offline (paho's thread)."""
        with self._lock:
            leaving = [c for c in self._channels.values()
                       if c.cid == cid and c.instance == instance]
        for channel in leaving:
            self.end(channel, ConnectionLost(self.peer(channel),
                                             "the client left (its MQTT status went offline)"),
                     notify=False)

    def server_left(self, instance: int) -> None:
        """Client: that server instance's status went offline (paho's thread): the link opened
        while it was live ends. Read under the lock: a link being opened with that
        instance among its servers (maybe_open) is registered first, then ended here."""
        with self._lock:
            current = self.current
        if current is not None and instance in current.servers:
            self.end(current, ConnectionLost(self.peer(current),
                                             "the server left (its MQTT status went offline)"),
                     notify=False)

    def peer(self, channel: Channel) -> uuid.UUID:
        """The peer's id for errors about this link: from the topic (server) or the server's
        announcement (client). Never None, which would read as "this communicator is
        closed"."""
        try:
            return uuid.UUID(channel.cid if self._is_server else channel.server_id)
        except ValueError:
            return uuid.UUID(int=0)

    def _all_channels(self) -> list[Channel]:
        """Every live channel, the client's current one included."""
        with self._lock:
            channels = list(self._channels.values())
            if self.current is not None:
                channels.append(self.current)
        return channels

    def refuse_new(self) -> None:
        """Open no more links (the server stops listening, or the carrier stops)."""
        self._accepting = False

    # ------------------------------------------------------------------ link acks and probes

    def flush_acks(self, now: float) -> float:
        """The loop's thread: ack what the peer asked for ``_LINK_ACK_DELAY`` ago or more,
        unless a packet did meanwhile; seconds until the next ack is due (inf: none).

        Not at once: the packet that asked usually brings a netq message whose ACK frame the
        loop holds for a reply to carry (``CarrierInfo.ack_hold``), and that packet's header
        carries the link ack too: one publish instead of two."""
        self.acks_due = False
        channels = self._all_channels()
        next_due = float("inf")
        for channel in channels:
            asked = channel.ack_due
            if not asked:
                continue
            state = channel.state
            if channel.closed or state.ack_sent >= state.received:
                channel.ack_due = 0.0
                continue
            wait = asked + _LINK_ACK_DELAY - now
            if wait > 0:
                next_due = min(next_due, wait)
                self.acks_due = True
                continue
            channel.ack_due = 0.0
            self.counters["acks_sent"] += 1
            self._publish(channel.topic_out, state.ack_header(), 0)
        return next_due

    def tick(self) -> None:
        """paho's thread: probe links whose acks stopped while packets are outstanding (a
        lost tail)."""
        now = time.monotonic()
        if now - self._last_tick < _TICK:
            return
        self._last_tick = now
        for channel in self._all_channels():
            state = channel.state
            if channel.closed or not state.outstanding or not self._connected():
                continue
            if now - state.last_progress < _PROBE_AFTER or now - channel.last_probe < _PROBE_AFTER:
                continue
            if channel.published_seq <= state.peer_acked:
                continue
            channel.last_probe = now
            self.counters["probes"] += 1
            ack = state.received
            state.ack_sent = ack
            probe = encode(int(Kind.ACK), ACK_REQUEST, channel.epoch, channel.published_seq, ack)
            # Same QoS as data: paho and the broker keep one QoS level in order, so the probe
            # never overtakes the packet it names.
            self._publish(channel.topic_out, probe, self._qos)

    # ------------------------------------------------------------------ client attempts

    def _new_window(self) -> Window:
        mqtt = self._mqtt
        return Window(mqtt.window_packets, mqtt.window_packets_max, mqtt.window_bytes)

    def request_attempt(self) -> None:
        """Client: the loop wants a link; it opens as soon as the broker and a server are up."""
        with self._lock:
            self._attempt_pending = True
        self.maybe_open()

    def maybe_open(self) -> None:
        """Client: complete a pending connection attempt once the broker and a server are up
        (any thread)."""
        if self._is_server:
            return
        with self._lock:
            if not (self._attempt_pending and self._connected()) or not self._accepting:
                return
            # Read under our lock: a server that leaves after this is told to server_left
            # only once the channel below is registered, so it ends the channel.
            servers = self._live_servers()
            if not servers:
                return
            self._attempt_pending = False
            self._attempts = (self._attempts + 1) & 0xFFFFFFFF
            epoch = (self._instance() << 32) | self._attempts
            window = self._windows.get(SERVER)
            if window is None:
                window = self._windows[SERVER] = self._new_window()
            channel = Channel(self._my_cid, epoch, LinkState(epoch, window),
                              f"{self._topics.c2s}{self._my_cid}")
            channel.servers = frozenset(servers)
            channel.server_id = next(iter(servers.values()), "")
            self.current = channel
        channel.opened = True
        self._post_opened(channel, self._address)

    # ------------------------------------------------------------------ introspection

    def statistics(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """How many links are up, and each peer's window (packets, gaps)."""
        with self._lock:
            windows = {cid: (w.packets, w.gaps) for cid, w in self._windows.items()}
            links = len(self._channels) + (self.current is not None)
        return links, windows
