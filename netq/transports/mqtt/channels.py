"""The MQTT channel table: which links exist, and what to do with each packet that arrives.

A *channel* is one link's carrier state (:class:`Channel`): the client id and epoch naming it,
the topic its packets go to, its :class:`~netq.transports.mqtt.link.LinkState` and the flags
the I/O thread and paho's thread exchange. A server keeps one per ``(client id, epoch)``, a
client at most one (``_current``); send windows (:class:`~netq.transports.mqtt.link.Window`)
are kept per peer and outlive links.

Per-packet judging (paho's thread): a packet for an unknown epoch opens a server channel if it
is an OPEN with seq 1 (at most ``_MAX_PENDING_EPOCHS`` per client id, so OPEN floods stay
bounded), else earns a rate-limited CLOSE answer. A known channel's packets go through
``LinkState.receive``: in-order bodies go to the engine, duplicates are counted, a gap or an
invalid ack ends the link (and tells the peer), a CLOSE ends it quietly. A requested link ack
goes out from the loop's thread a moment later (:meth:`ChannelTableMixin._flush_acks`), unless
a packet carried it meanwhile.

The probe timer (:meth:`ChannelTableMixin._tick`, on paho's thread through
:class:`~netq.transports.mqtt.paho_adapter.PahoClient`'s ``loop_misc``) probes links whose acks
stopped while packets are outstanding: a lost tail shows up as a gap at the receiver.

:class:`ChannelTableMixin` is a part of
:class:`~netq.transports.mqtt.transport.MQTTCarrier` (split out by topic, not a class of its
own): it uses the transport's ``_lock``, ``_channels``, ``_current``, ``_windows``,
``_client``, ``_mqtt``, ``counters`` and connection state, and the packet base's
``channel_opened``, ``channel_closed``, ``packet_received`` and ``wake`` (all declared on
:class:`~netq.transports.mqtt.shared.MQTTShared`).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from ...exceptions import ConnectionLost
from .link import ACK_REQUEST, GAP, HEADER_SIZE, Kind, LinkState, Verdict, Window, encode
from .presence import SERVER
from .shared import MQTTShared

__all__ = ("Channel", "ChannelTableMixin")

LOGGER = logging.getLogger("netq")
_PROBE_AFTER = 0.5  # seconds without ack progress after which a sender probes its tail
_TICK = 0.25  # seconds between probe checks on paho's thread (it passes at least every 1 s)
_MAX_PENDING_EPOCHS = 4  # links per client id not yet authenticated (bounds OPEN floods)
_CLOSE_REPLY_INTERVAL = 0.5  # seconds between CLOSE answers to one stale epoch
_OPEN = int(Kind.OPEN)
# Seconds a requested link ack waits for a packet to carry it before it is published alone:
# longer than the loop holds a lone netq ACK (MQTTCarrier.ack_hold), which such a packet brings.
_LINK_ACK_DELAY = 0.002

Header = tuple[int, int, int, int, int]  # (kind, flags, epoch, seq, ack), see link.parse_header
Payload = bytes | memoryview  # a large publish arrives as a view of paho's buffer (zero-copy)


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


class ChannelTableMixin(MQTTShared):
    """The channels of an MQTT transport: opening, judging packets, acks, probes, ending."""

    def _server_packet(self, cid: str, header: Header, payload: Payload) -> None:
        kind, flags, epoch, seq, ack = header
        key = (cid, epoch)
        channel = self._channels.get(key)
        if channel is None:
            if kind == _OPEN and seq == 1 and not self._refusing and not self._stopped:
                channel = self._open_server_channel(cid, epoch)
            if channel is None:
                self.counters["stale_packets"] += 1
                if kind != int(Kind.CLOSE):
                    self._reply_close(cid, epoch)
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
            channel = Channel(cid, epoch, LinkState(epoch, window), f"{self._s2c}{cid}")
            self._channels[(cid, epoch)] = channel
        # Bound to the client id of its topics: the peer's HELLO must name that id (no
        # impersonation through someone else's topics).
        channel.opened = True
        self.channel_opened(channel, f"mqtt:{cid}", bound_to=cid)
        return channel

    def _client_packet(self, header: Header, payload: Payload) -> None:
        kind, flags, epoch, seq, ack = header
        channel = self._current
        if channel is None or channel.epoch != epoch or channel.closed:
            self.counters["stale_packets"] += 1
            return
        self._judge(channel, kind, flags, seq, ack, payload)

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
                self.packet_received(channel, memoryview(payload)[HEADER_SIZE:])
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
                           self._purpose.value, channel.cid, channel.epoch, first, last)
            self._end(channel, ConnectionLost(
                self._peer(channel), f"MQTT broker dropped link packets {first}..{last}"),
                notify=True, gap=True)
            return
        elif verdict is Verdict.CLOSED:
            channel.peer_closed = True
            if flags & GAP:
                state.window.lost()
            reason = bytes(payload[HEADER_SIZE:]).decode(errors="replace") or "closed"
            self._end(channel,
                      ConnectionLost(self._peer(channel), f"peer ended the link: {reason}"),
                      notify=False)
            return
        elif verdict is Verdict.INVALID:
            self.counters["invalid_packets"] += 1
            self._end(channel, ConnectionLost(self._peer(channel), "invalid link acknowledgement"),
                      notify=True)
            return
        if ack_now and not channel.closed:
            # Asked for an ack: let the I/O thread send it after its next pass, so that it
            # rides on the netq frames that pass produces (ACK/CREDIT) when there are any.
            if not channel.ack_due:
                channel.ack_due = time.monotonic()
            self._acks_due = True
            self.wake()
        if channel.wants_wake and state.can_send():
            channel.wants_wake = False
            self.wake()

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
        header = encode(int(Kind.CLOSE), 0, epoch, 0, 0)
        self._client.publish(f"{self._s2c}{cid}", header + b"unknown link", qos=self._mqtt.qos)

    def _end(self, channel: Channel, error: BaseException | str, *, notify: bool, gap: bool = False,
             tell_base: bool = True) -> None:
        """The link is over (any thread): tell the peer if asked, then the base (unless the
        base is the one ending it)."""
        with self._lock:
            if channel.closed:
                return
            channel.closed = True
            if self._channels.get((channel.cid, channel.epoch)) is channel:
                del self._channels[(channel.cid, channel.epoch)]
            if self._current is channel:
                self._current = None
        if notify and self._connected:
            self._client.publish(channel.topic_out,
                                 channel.state.close_header(gap) + str(error).encode()[:200],
                                 qos=self._mqtt.qos)
        if tell_base and channel.opened:
            # A reason string comes only from the base closing the link (tell_base=False).
            assert isinstance(error, BaseException)
            self.channel_closed(channel, error)

    def _peer(self, channel: Channel) -> Any:
        """The peer's id for errors about this link: from the topic (server) or the server's
        announcement (client). Never None, which would read as "this communicator is
        closed"."""
        try:
            return uuid.UUID(channel.cid if self._is_server else channel.server_id)
        except ValueError:
            return uuid.UUID(int=0)

    def _all_channels(self) -> list[Channel]:
        """Every live channel, the client's current one included (``_lock`` held)."""
        channels = list(self._channels.values())
        if self._current is not None:
            channels.append(self._current)
        return channels

    # ------------------------------------------------------------------ link acks and probes

    def _flush_acks(self, now: float) -> float:
        """The loop's thread: ack what the peer asked for ``_LINK_ACK_DELAY`` ago or more,
        unless a packet did meanwhile; seconds until the next ack is due (inf: none).

        Not at once: the packet that asked usually brings a netq message whose ACK frame the
        loop holds for a reply to carry (``CarrierInfo.ack_hold``), and that packet's header
        carries the link ack too: one publish instead of two."""
        self._acks_due = False
        with self._lock:
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
                self._acks_due = True
                continue
            channel.ack_due = 0.0
            self.counters["acks_sent"] += 1
            self._client.publish(channel.topic_out, state.ack_header(), qos=0)
        return next_due

    def _tick(self) -> None:
        """Probe links whose acks stopped while packets are outstanding (a lost tail)."""
        now = time.monotonic()
        if now - self._last_tick < _TICK:
            return
        self._last_tick = now
        with self._lock:
            channels = self._all_channels()
        for channel in channels:
            state = channel.state
            if channel.closed or not state.outstanding or not self._connected:
                continue
            if now - state.last_progress < _PROBE_AFTER or now - channel.last_probe < _PROBE_AFTER:
                continue
            if channel.published_seq <= state.peer_acked:
                continue
            channel.last_probe = now
            self.counters["probes"] += 1
            ack = state.received
            state.ack_sent = ack
            probe = encode(int(Kind.ACK), ACK_REQUEST, channel.epoch,
                                     channel.published_seq, ack)
            # Same QoS as data: paho and the broker keep one QoS level in order, so the probe
            # never overtakes the packet it names.
            self._client.publish(channel.topic_out, probe, qos=self._mqtt.qos)

    # ------------------------------------------------------------------ client attempts

    def _new_window(self) -> Window:
        mqtt = self._mqtt
        return Window(mqtt.window_packets, mqtt.window_packets_max, mqtt.window_bytes)

    def _maybe_open(self) -> None:
        """Client: complete a pending connection attempt once the broker and a server are up."""
        if self._is_server:
            return
        with self._lock:
            if not (self._attempt_pending and self._connected and self._servers) or self._stopped:
                return
            self._attempt_pending = False
            self._attempts = (self._attempts + 1) & 0xFFFFFFFF
            epoch = (self._instance << 32) | self._attempts
            window = self._windows.get(SERVER)
            if window is None:
                window = self._windows[SERVER] = self._new_window()
            channel = Channel(self._my_cid, epoch, LinkState(epoch, window),
                               f"{self._c2s}{self._my_cid}")
            channel.servers = frozenset(self._servers)
            channel.server_id = next(iter(self._servers.values()), "")
            self._current = channel
        netloc = self._options.netloc
        channel.opened = True
        self.channel_opened(channel, f"mqtt://{netloc.host}:{netloc.port}/{self._base}")
