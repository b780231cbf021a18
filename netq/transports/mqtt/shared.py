"""The state :class:`~netq.transports.mqtt.transport.MQTTCarrier` shares with its parts.

:class:`MQTTShared` declares (annotations only, no behaviour) the attributes that
``MQTTCarrier.__init__`` sets and that :class:`~.presence.PresenceMixin` and
:class:`~.channels.ChannelTableMixin` use, and the methods one part calls on another, so that
each part is type-checked against the whole transport. It is a :class:`PacketCarrier`, so the
parts also see the packet base's ``_options``, ``_purpose``, ``channel_opened``,
``channel_closed``, ``packet_received`` and ``wake``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..packets import PacketCarrier

if TYPE_CHECKING:
    from ...options import MQTTOptions
    from .channels import Channel
    from .link import Window
    from .paho_adapter import PahoClient

__all__ = ("MQTTShared",)


class MQTTShared(PacketCarrier["Channel"]):
    """Typing base of the MQTT transport's parts; every attribute is set in
    ``MQTTCarrier.__init__`` (see there for what each holds)."""

    _mqtt: MQTTOptions
    _base: str  # topic prefix <prefix>/<service>
    _c2s: str
    _s2c: str
    _status: str
    _is_server: bool
    _my_cid: str
    _lock: threading.Lock
    _channels: dict[tuple[str, int], Channel]
    _current: Channel | None
    _windows: dict[str, Window]
    _connected: bool
    _servers: dict[int, str]  # client: live server instances -> their ids
    _hints: dict[int, float]  # client: retained "online" not yet confirmed -> first seen
    _announced_at: float
    _asked_at: float
    _server_seen_at: float
    _broker_ready_at: float
    _attempt_pending: bool
    _acks_due: bool
    _last_tick: float
    _refusing: bool
    _stopped: bool
    _attempts: int
    _instance: int
    _close_replies: dict[tuple[str, int], float]
    counters: dict[str, int]
    _client: PahoClient

    if TYPE_CHECKING:
        # Implemented by ChannelTableMixin, called by PresenceMixin.
        def _end(self, channel: Channel, error: BaseException | str, *, notify: bool,
                 gap: bool = False, tell_base: bool = True) -> None: ...

        def _peer(self, channel: Channel) -> Any: ...

        def _maybe_open(self) -> None: ...

