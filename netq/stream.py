"""net-queue's ``stream`` module, kept: the chunk pipe and the serializers under the names
net-queue documents (``stream.Stream``, ``stream.PickleSerializer(restrict=...)``,
``stream.BytesSerializer()``).

Code written against net-queue (``from net_queue.stream import PickleSerializer``) runs with
``netq`` in place of ``net_queue``. These are the very classes of :mod:`netq.chunk_stream`
(where :class:`Stream` is built) and :mod:`netq.serializers` (where the serializers are), not
copies or subclasses: ``netq.stream.PickleSerializer is netq.serializers.PickleSerializer``.
``tests/test_seed_names.py`` walks every name net-queue's README documents.
"""

from __future__ import annotations

from .chunk_stream import Buffer, Stream, as_view
from .serializers import BytesSerializer, PickleSerializer

__all__ = ("Buffer", "Stream", "as_view", "BytesSerializer", "PickleSerializer")
