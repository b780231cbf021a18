"""netq.protocol.reassembly: a message's parts, filled while its body arrives or cut out whole.

Each part is allocated once at its final size and kind (netq._buffers): a ``bytearray`` when
writable; when read-only ``bytes`` below LARGE (sealed once full) and a read-only memoryview
from LARGE. The I/O layer writes through :meth:`Incoming.target` straight into them.
"""

from __future__ import annotations

import pytest

from netq._buffers import LARGE, ReceivePool
from netq.protocol.events import MessageReceived
from netq.protocol.frames import READONLY_BIT
from netq.protocol.reassembly import Incoming, cut_whole

from .helpers import payload


def raw(size: int, readonly: bool) -> int:
    return size | READONLY_BIT if readonly else size


SPECS = [(10, True), (LARGE - 1, True), (LARGE, True), (3 * LARGE, False), (0, True), (5, False)]


def kinds(parts) -> list[str]:
    return [("view" if p.readonly else "writable view") if type(p) is memoryview
            else type(p).__name__ for p in parts]


EXPECTED_KINDS = ["bytes", "bytes", "view", "bytearray", "bytes", "bytearray"]


@pytest.mark.parametrize("step", [1, 7, 4093, LARGE + 1, 10**7])
def test_a_body_filled_in_any_steps_lands_in_parts_of_their_final_kind(step):
    data = b"".join(payload(size, index) for index, (size, _) in enumerate(SPECS))
    incoming = Incoming(4, True, [raw(s, r) for s, r in SPECS], len(data), ReceivePool())
    position = 0
    while position < len(data):
        if step > 1000:  # as recv_into: write into the target itself
            target = incoming.target(step)
            count = len(target)
            target[:] = data[position:position + count]
            incoming.advance(count)
        else:
            count = min(step, len(data) - position)
            incoming.fill(memoryview(data)[position:position + count])
        position += count
    assert incoming.remaining == 0
    message = incoming.finish()
    assert isinstance(message, MessageReceived) and (message.seq, message.batch) == (4, True)
    assert kinds(message.parts) == EXPECTED_KINDS
    assert b"".join(bytes(p) for p in message.parts) == data
    assert message.size == len(data)


def test_a_whole_body_is_cut_into_parts_of_their_final_kind():
    data = b"".join(payload(size, index) for index, (size, _) in enumerate(SPECS))
    buffer = bytearray(b"head" + data)
    parts = cut_whole(memoryview(buffer), buffer, 4, tuple(raw(s, r) for s, r in SPECS),
                      ReceivePool())
    assert kinds(parts) == EXPECTED_KINDS
    assert b"".join(bytes(p) for p in parts) == data
    buffer[:] = bytes(len(buffer))  # the staging buffer is reused: parts are their own memory
    assert b"".join(bytes(p) for p in parts) == data


def test_the_target_never_crosses_a_part_and_respects_the_limit():
    incoming = Incoming(1, False, [LARGE, LARGE], 2 * LARGE, ReceivePool())
    assert len(incoming.target(10)) == 10
    assert len(incoming.target(10 * LARGE)) == LARGE
    incoming.advance(LARGE - 3)
    assert len(incoming.target(10 * LARGE)) == 3
