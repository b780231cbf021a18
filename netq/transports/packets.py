"""Packet carriers: each link's netq byte stream as a sequence of packets.

MQTT publishes and gRPC stream messages are packets: a carrier library (paho, grpcio) moves
them on threads of its own. :class:`PacketCarrier` turns that into the
:class:`netq.carrier.Carrier` interface the loop drives:

- Outgoing: :meth:`PacketCarrier.write` cuts one packet of at most :meth:`_packet_limit` body
  bytes off the front of the link's output and hands it to the subclass (:meth:`_send`) while
  :meth:`_can_send` allows: carrier-side buffering stays bounded, and once the carrier has room
  again (it calls :meth:`wake`) the next :meth:`wait` reports the channel ``WRITABLE``.
- Incoming: carrier threads only post what happened (:meth:`channel_opened`,
  :meth:`packet_received`, :meth:`channel_closed`, :meth:`connect_failed`: thread-safe appends);
  :meth:`wait` hands the events to the loop in arrival order, each packet as ``DATA`` (the loop
  feeds it to the link's Connection: one copy, straight into the final part buffer for large
  bodies).

Frames may span packets: a packet is a slice of the byte stream, so the carrier must deliver
a link's packets complete, once and in order (gRPC streams do; MQTT adds sequence numbers and
breaks the link on a gap, which session resume repairs).
"""

from __future__ import annotations

import collections
import threading
from abc import ABC, abstractmethod
from collections.abc import MutableSequence
from typing import Generic, TypeVar

from ..carrier import (
    CLOSED,
    DATA,
    FAILED,
    OPENED,
    WRITABLE,
    Address,
    CarrierInfo,
    Event,
    Opened,
    cut,
)
from ..options import CommunicatorOptions, Purpose
from ..protocol.sending import Buffer

__all__ = ("PacketCarrier", "PACKET_SIZE")

PACKET_SIZE = 1024 * 1024  # bytes: default body per packet (the sweet spot measured for MQTT)

ChannelT = TypeVar("ChannelT")
"""The carrier's handle of one link: MQTT's topic pair (``mqtt.channels.Channel``), gRPC's
``grpc.streams.Stream``."""


class PacketCarrier(ABC, Generic[ChannelT]):
    """Base of MQTT and gRPC: subclasses implement the hooks marked "subclass"."""

    user_threads_write = False  # a subclass whose _send may run on a user's thread says so
    any_thread_waits = False  # a subclass whose wait() may run on any thread says so
    ack_hold = 0.0  # see CarrierInfo
    ack_hold_always = False
    ack_defer = 0.0

    def __init__(self, options: CommunicatorOptions, purpose: Purpose) -> None:
        self._options = options
        self._purpose = purpose
        self._server = purpose is Purpose.SERVER
        self._events: collections.deque[Event] = collections.deque()  # appends: thread-safe
        self._signal = threading.Event()
        self._blocked: set[ChannelT] = set()  # channels a write found without room
        self._closed = False
        self.address: Address = None
        if self._server:
            try:
                self._listen()  # bind now so a taken port raises from netq.new()
            except BaseException:
                self._stop_carrier()
                raise
        self.info = CarrierInfo(address=self.address,
                                target=self._target(), any_thread_waits=self.any_thread_waits,
                                user_threads_write=self.user_threads_write,
                                ack_hold=self.ack_hold, ack_hold_always=self.ack_hold_always,
                                ack_defer=self.ack_defer)

    # ----------------------------------------------------------------- subclass hooks

    @abstractmethod
    def _listen(self) -> None:
        """Subclass, server: start the carrier now (constructor); set ``self.address``."""

    def _target(self) -> str:
        """Client: where attempts go, in words."""
        return str(self._options.netloc)

    @abstractmethod
    def _start_connect(self) -> None:
        """Subclass, client: start one attempt; later call channel_opened or connect_failed."""

    def _stop_listening(self) -> None:
        """Subclass, server: refuse newcomers from now on. Idempotent."""

    def _can_send(self, channel: ChannelT) -> bool:
        """Subclass: may another packet go to the carrier for this channel now?"""
        return True

    @abstractmethod
    def _send(self, channel: ChannelT, parts: list[Buffer], size: int) -> None:
        """Subclass: hand one packet (``parts``, ``size`` body bytes) to the carrier."""

    def _close_channel(self, channel: ChannelT) -> None:
        """Subclass: release the channel; idempotent, never blocks long."""

    def _stop_carrier(self) -> None:
        """Subclass: stop and join every carrier thread, close everything. Once, at the end."""

    def _packet_limit(self, channel: ChannelT) -> int:
        """Body bytes per packet."""
        return min(PACKET_SIZE, self._options.connection.max_size)

    def _sleep(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for wake() (a carrier running its own event loop, like
        grpc.aio, overrides this and wake() to run that loop meanwhile)."""
        signal = self._signal
        if not self._events:
            signal.wait(timeout)
        # Cleared before the events are taken: anything posted from here on sets it again.
        signal.clear()

    # ----------------------------------------------------------------- carrier side (any thread)

    def channel_opened(self, channel: ChannelT, address: object,
                       bound_to: str | None = None) -> None:
        """A new channel: the loop makes it a link (its HELLO goes out), or closes it."""
        self._post((OPENED, channel, Opened(address, bound_to)))

    def packet_received(self, channel: ChannelT, payload: Buffer) -> None:
        """One packet body for ``channel`` (header already removed), in order."""
        self._post((DATA, channel, payload))

    def channel_closed(self, channel: ChannelT, error: BaseException | None = None) -> None:
        """The channel ended (``error`` None: a clean end) or broke."""
        self._post((CLOSED, channel, error))

    def connect_failed(self, error: BaseException | None = None) -> None:
        """Client: the attempt failed; the loop retries after a backoff."""
        self._post((FAILED, None, str(error) if error is not None else "the attempt failed"))

    def _post(self, event: Event) -> None:
        self._events.append(event)
        self.wake()

    # ----------------------------------------------------------------- the carrier interface

    def wake(self) -> None:
        self._signal.set()

    def admit(self, on: bool) -> None:
        if self._server:
            if not on:
                self._stop_listening()
        elif on:
            self._start_connect()
        # A client's attempt under way ends in channel_opened/connect_failed; an opened
        # channel the loop no longer wants, it closes.

    def explain(self) -> str | None:
        return None

    def wait(self, timeout: float) -> list[Event]:
        self._sleep(timeout)
        events = self._events
        taken = [events.popleft() for _ in range(len(events))]
        if self._blocked:
            # Room may have come (the carrier woke us): the loop writes them again.
            taken.extend((WRITABLE, channel, None) for channel in self._blocked)
            self._blocked.clear()
        return taken

    def read_into(self, channel: ChannelT, buffer: memoryview,
                  fds: MutableSequence[int] | None = None) -> int:
        raise BlockingIOError  # packets come as DATA events

    def write(self, channel: ChannelT, buffers: list[Buffer],
              fds: list[int] | None = None) -> int:  # no descriptors: info.passes_fds is off
        if not self._can_send(channel):
            self._blocked.add(channel)
            return 0
        parts, size = cut(buffers, self._packet_limit(channel))
        self._send(channel, parts, size)
        return size

    def close(self, channel: ChannelT | None) -> None:
        if channel is not None:
            self._blocked.discard(channel)
            self._close_channel(channel)
            return
        if self._closed:
            return
        self._closed = True
        self._stop_carrier()
        # What carriers posted after the loop's last look: channels nobody will use.
        while self._events:
            kind, opened, _ = self._events.popleft()
            if kind is OPENED:
                self._close_channel(opened)  # type: ignore[arg-type]
