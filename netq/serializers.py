"""The serializers that produce and consume :class:`~netq.stream.Stream` objects.

Serializers
-----------
A serializer is any object with ``dump(obj) -> Stream`` and ``load(stream) -> obj`` (see
:class:`Serializer`). :class:`BytesSerializer` moves raw bytes; :class:`PickleSerializer`
(the default) moves any picklable object.

:class:`PickleSerializer` uses pickle protocol 5 so that PEP 574 buffers (numpy arrays, and
any type whose ``__reduce_ex__`` returns a :class:`pickle.PickleBuffer`) travel *out of band*:
chunk 0 is the pickle stream and chunks 1..n are the raw buffers, in the order the pickle
refers to them. A buffer of at least ``copy_threshold`` **bytes** goes out of band; a smaller
one is copied into the pickle stream, because for small buffers an extra part costs more than
the copy it saves. Zero-length buffers always stay in band. A *top-level* ``bytes``,
``bytearray`` or ``memoryview`` is wrapped in a :class:`pickle.PickleBuffer` so that it, too,
goes out of band when large (pickle would otherwise copy it into the stream). After a round
trip through a transport:

* ``bytes`` comes back as ``bytes`` below 64 KiB and, when out of band, from 64 KiB as a
  read-only ``memoryview`` (format ``"B"``) of the receive buffer itself, not a copy (equal to
  the bytes sent; ``bytes(obj)`` makes the copy where a ``bytes`` object is needed);
* ``bytearray`` comes back as ``bytearray``;
* ``memoryview`` comes back as ``bytes`` (from 64 KiB out of band: a read-only
  ``memoryview``) when it was read-only and ``bytearray`` when it was writable, holding the
  view's raw bytes (shape and format are not kept);
* numpy arrays come back as numpy arrays over the receive buffer, writable when the sender's
  array was. A top-level array with a plain dtype (no objects, fields or sub-arrays) that is C-
  or Fortran-contiguous skips pickle altogether: a small header (dtype, shape, order) and its
  bytes (docs/protocol.md, "What the parts hold"); one smaller than ``copy_threshold`` comes
  back as a writable copy. An ``np.memmap`` travels the same way and comes back as a plain
  ``ndarray`` (read-only when the map was opened ``"r"``).

``load`` on a stream straight from ``dump`` (no transport in between) gives the *same* objects
back for ``bytes``/``bytearray`` payloads; a ``memoryview`` payload then comes back as a view.

Restricting what a pickle may load
----------------------------------
Unpickling runs code: a pickle names globals (functions, classes) and calls them. ``restrict``
limits which globals a :class:`PickleSerializer` will look up; anything else raises
:class:`pickle.UnpicklingError` *before* it is called, so a forbidden pickle executes nothing.
Entries of ``restrict`` are:

* ``"module.qualname"`` (``"collections.OrderedDict"``): that one global;
* ``"module"`` (``"numpy"``): every global *defined* in that module or its submodules. The
  looked-up object's ``__module__`` must lie inside an allowed module (so ``logging.os.system``
  cannot smuggle ``os.system`` in through ``"logging"``), names with a dunder part
  (``load.__builtins__``) are refused, and submodules with a dunder part (``pkg.__main__``) are
  never imported. Allowing a whole module still trusts *every* function in it: ``"numpy"``
  admits ``numpy.savetxt``, which writes files. For untrusted peers list exact names, e.g.
  :attr:`PickleSerializer.NUMPY_GLOBALS`;
* ``"builtins"``: **only** :attr:`PickleSerializer.SAFE_BUILTINS` (scalar and container types,
  ``Ellipsis``, ``NotImplemented`` and the exception classes), never ``eval``, ``exec``,
  ``getattr``, ``open``... Any other builtin must be listed by its full name
  (``"builtins.getattr"``).

Protocol 5 pickles of plain classes and dataclasses name the class itself (``"mymod.Point"``)
and nothing from ``copyreg``; objects whose ``__reduce__`` returns other callables need those
callables listed too. Container and bytes types are not in ``SAFE_BUILTINS``: pickle builds
them with opcodes, and leaving them out stops a small pickle from calling
``bytearray(10**12)``. The message size limit bounds the pickle, not what an allowed callable
builds, so allow only what your data needs.
"""

from __future__ import annotations

import builtins
import mmap
import pickle
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import islice
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from .chunk_stream import Buffer, Stream, as_view
from .numpy_arrays import array_parts, is_plain_array, load_array
from .restricted_pickle import Policy, RestrictedUnpickler

__all__ = (
    "Serializer",
    "BytesSerializer",
    "PickleSerializer",
    "InlineForms",
    "DEFAULT_SERIALIZER",
)


# Types whose pickles never contain out-of-band buffers.
_NO_BUFFERS: frozenset[type] = frozenset((bytes, str, int, float, bool, type(None), complex))


class InlineForms(NamedTuple):
    """What a serializer's caller may do per message itself, with no Python call of its own
    in between (:meth:`PickleSerializer.inline_forms`; the communicator's ``put()`` and
    ``get()`` do), giving the same bytes and objects as ``dump_parts`` and ``load_parts``.

    ``types``: an object of exactly one of these types is dumped as ``(dumps(obj),)``,
    except a ``bytes`` object of ``bytes_by_reference_from`` bytes or more (``dump_parts``
    sends that one by reference). ``loads``: a message of one part whose first byte is not
    ``0x00`` (an array's header) is ``loads(part)``; None where every load must go through
    ``load_parts`` (a restricting serializer checks every global).
    """

    types: frozenset[type]
    bytes_by_reference_from: int
    dumps: Callable[[Any], bytes]
    loads: Callable[[Any], Any] | None


def _load_buffer(view: memoryview) -> Any:
    # Handing pickle the receive buffer itself rather than a view of it is what lets a bytes
    # payload come back as that very bytes object (READONLY_BUFFER keeps a read-only object as
    # is) and a bytearray payload as that bytearray. A read-only view of a bytearray stays a
    # view, so that load never grants write access the chunk did not have.
    obj = view.obj
    if type(obj) is (bytes if view.readonly else bytearray) and len(obj) == view.nbytes:
        return obj
    return view


@runtime_checkable
class Serializer(Protocol):
    """What netq needs from a serializer: ``dump(obj) -> Stream`` and ``load(stream) -> obj``.

    ``load`` receives a stream whose chunks view the receive buffers, one per chunk that
    ``dump`` produced; it may keep references to them. Both must be thread-safe.
    """

    def dump(self, obj: Any) -> Stream: ...

    def load(self, stream: Stream) -> Any: ...


class BytesSerializer:
    """Moves raw bytes: ``dump`` takes any bytes-like object, ``load`` returns ``bytes``.

    ``dump`` views the data (no copy). ``load`` returns the receive buffer itself when it is a
    single ``bytes`` object, and joins the chunks otherwise. ``load_parts`` (what ``get()``
    uses) returns a single read-only part as it arrived: ``bytes`` below 64 KiB, a read-only
    ``memoryview`` of the receive buffer from 64 KiB (no copy). Stateless and thread-safe.
    """

    __slots__ = ()

    def dump(self, data: Buffer) -> Stream:
        """A one-chunk stream viewing ``data`` (an empty stream for empty ``data``)."""
        return Stream.frombytes(data)

    def load(self, stream: Stream) -> bytes:
        """The stream's bytes (``b""`` for an empty stream)."""
        return stream.tobytes()

    # Part-list forms used by netq's communicator on the hot path: the same wire format as
    # dump/load, without building Stream objects.
    def dump_parts(self, data: Buffer) -> Sequence[Buffer]:
        if type(data) is bytes:
            return (data,) if data else ()
        view = as_view(data)
        return (view,) if view.nbytes else ()

    def load_parts(self, parts: list) -> bytes | memoryview:
        if len(parts) == 1 and (type(parts[0]) is bytes
                                or type(parts[0]) is memoryview and parts[0].readonly):
            return parts[0]
        return b"".join(parts)

    def __repr__(self) -> str:
        return "BytesSerializer()"


# A netq message carries at most 1024 parts (netq.protocol.frames.MAX_PARTS): the pickle and
# this many out-of-band buffers. Buffers past it are pickled in band (copied) instead.
MAX_OUT_OF_BAND = 1023

# Containers and bytes are built by pickle opcodes, never by calling these globals; leaving
# `bytes`, `bytearray`, `list`, ... out stops a tiny pickle from calling bytearray(10**12).
_SAFE_BUILTIN_NAMES = (
    "bool", "int", "float", "complex", "str", "slice", "range",
    "Ellipsis", "NotImplemented",
)  # fmt: skip


def _as_sent(obj: Any) -> Any:
    """A top-level bytearray or memoryview travels as a bare out-of-band buffer, and pickle
    hands back the received buffer object itself: a bytearray on the socket path, the
    mapping of a shared-memory segment (an ``mmap``) over ``Protocol.UNIX``. The caller put a
    bytearray, so it gets one (copied out of the segment, which is then released)."""
    if type(obj) is mmap.mmap:
        return bytearray(obj)
    return obj


class PickleSerializer:
    """Pickle protocol 5 with out-of-band buffers; optionally restricted to listed globals.

    ``restrict``: ``None`` loads anything (only for trusted peers), else an iterable of allowed
    globals, see the module docstring: ``"module.qualname"`` allows one global, ``"module"``
    everything defined in that module and its submodules, and ``"builtins"`` only
    :attr:`SAFE_BUILTINS`. ``copy_threshold``: buffers of at least this many bytes travel as
    separate chunks instead of being copied into the pickle. ``protocol``: 5 or higher (out-of-
    band buffers need 5). Stateless and thread-safe.
    """

    __slots__ = ("_restrict", "_policy", "_copy_threshold", "_protocol", "_bytes_by_reference")

    SAFE_BUILTINS: ClassVar[frozenset[str]] = frozenset(
        [f"builtins.{name}" for name in _SAFE_BUILTIN_NAMES]
        + [
            f"builtins.{name}"
            for name, value in vars(builtins).items()
            if isinstance(value, type) and issubclass(value, BaseException)
        ]
    )
    """Builtins that only build data: scalars, containers, constants, exception classes."""

    NUMPY_GLOBALS: ClassVar[frozenset[str]] = frozenset(
        f"{prefix}.{name}"
        for prefix in ("numpy._core", "numpy.core")  # numpy >= 2 and numpy 1.x pickles
        for name in (
            "numeric._frombuffer",
            "multiarray._reconstruct",
            "multiarray.scalar",
        )
    ) | frozenset(("numpy.dtype", "numpy.ndarray"))
    """The numpy globals that pickles of arrays, dtypes and numpy scalars need, and no others
    (``restrict=["numpy"]`` also admits them, but trusts all of numpy)."""

    def __init__(
        self,
        restrict: Iterable[str] | None = None,
        copy_threshold: int = 65536,
        protocol: int = 5,
    ) -> None:
        if isinstance(restrict, str):
            raise TypeError(f"restrict must be an iterable of names, not the string {restrict!r}")
        if not isinstance(copy_threshold, int) or copy_threshold < 0:
            raise ValueError(f"copy_threshold must be an int >= 0 bytes, got {copy_threshold!r}")
        if not isinstance(protocol, int) or not 5 <= protocol <= pickle.HIGHEST_PROTOCOL:
            raise ValueError(
                f"protocol must be between 5 and {pickle.HIGHEST_PROTOCOL}, got {protocol!r}"
            )
        self._copy_threshold = copy_threshold
        self._protocol = protocol
        # The pickle of a top-level bytes object sent out of band: the same few opcodes
        # ("the next buffer, read-only") whatever its size.
        self._bytes_by_reference = pickle.dumps(pickle.PickleBuffer(b"\0"), protocol,
                                                buffer_callback=lambda buffer: False)
        if restrict is None:
            self._restrict: frozenset[str] | None = None
            self._policy: Policy | None = None
        else:
            entries = frozenset(restrict)
            for entry in entries:
                if not isinstance(entry, str) or not entry:
                    raise TypeError(f"restrict entries must be non-empty strings, got {entry!r}")
            names = set(entries)
            modules = []
            for entry in entries:
                if entry == "builtins":
                    names.discard(entry)
                    names |= self.SAFE_BUILTINS
                else:
                    # Whether an entry names a module or a global is unknown without importing
                    # it, so it counts as both: a global's name as a module prefix matches no
                    # real module, and a module's name never equals "module.name" of a global.
                    modules.append(entry)
            self._restrict = entries
            self._policy = Policy(frozenset(names), tuple(sorted(modules)))

    @property
    def restrict(self) -> frozenset[str] | None:
        """The allowed globals as given, or ``None`` when unrestricted."""
        return self._restrict

    @property
    def copy_threshold(self) -> int:
        """Buffers of at least this many bytes go out of band."""
        return self._copy_threshold

    @property
    def protocol(self) -> int:
        """The pickle protocol used by :meth:`dump`."""
        return self._protocol

    def dump(self, obj: Any) -> Stream:
        """Pickle ``obj``: chunk 0 is the pickle, chunks 1..n its out-of-band buffers."""
        threshold = self._copy_threshold
        kind = type(obj)
        numpy = sys.modules.get("numpy")  # never imported here: only a caller's arrays
        if numpy is not None and is_plain_array(kind, numpy):  # as in dump_parts
            parts = array_parts(obj, threshold)
            if parts is not None:
                return Stream(parts)
        if kind is memoryview:
            # memoryview itself is not picklable; as a PickleBuffer it travels as its raw bytes.
            obj = pickle.PickleBuffer(obj)
        elif (kind is bytes or kind is bytearray) and len(obj) >= threshold:
            obj = pickle.PickleBuffer(obj)
        views: list[memoryview] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            view = buffer.raw()
            nbytes = view.nbytes
            if nbytes < threshold or not nbytes or len(views) >= MAX_OUT_OF_BAND:
                return True  # in band (a copy, but a message has room for only so many parts)
            views.append(view)
            return False

        data = pickle.dumps(obj, self._protocol, buffer_callback=out_of_band)
        nbytes = len(data)
        for view in views:
            nbytes += view.nbytes
        return Stream.from_flat_views((memoryview(data), *views), nbytes)

    def inline_forms(self) -> InlineForms:
        """The forms of :meth:`dump_parts` and :meth:`load_parts` for plain objects that a
        caller may use inline (:class:`~netq.serializers.InlineForms`): C functions, no Python
        frame."""
        return InlineForms(_NO_BUFFERS, self._copy_threshold or 1,
                           partial(pickle.dumps, protocol=self._protocol),
                           pickle.loads if self._policy is None else None)

    def dump_parts(self, obj: Any) -> Sequence[Any]:
        """:meth:`dump` as a plain sequence: the pickle (``bytes``), then out-of-band views.

        A tuple where it can be: a tuple of bytes is untracked by the cyclic garbage
        collector at its first pass, a list stays tracked while the message is queued."""
        kind = type(obj)
        if kind is bytes and obj and len(obj) >= self._copy_threshold:
            # What dump() makes of it, without pickling: the bytes object itself travels.
            return (self._bytes_by_reference, obj)
        if kind in _NO_BUFFERS:
            # Nothing in these can produce a PickleBuffer: skip the callback machinery.
            return (pickle.dumps(obj, self._protocol),)
        numpy = sys.modules.get("numpy")  # never imported here: only a caller's arrays
        # getattr with a default: a numpy that another thread is importing is in sys.modules
        # before its ndarray is bound; an object of this thread is then no array of it.
        if numpy is not None and is_plain_array(kind, numpy):
            parts = array_parts(obj, self._copy_threshold)
            if parts is not None:
                return parts
        return [chunk if index else bytes(chunk) if chunk.nbytes < 4096 else chunk
                for index, chunk in enumerate(self.dump(obj))]

    def load_parts(self, parts: list) -> Any:
        """:meth:`load` from a plain list of received buffers."""
        if parts and parts[0][:1] == b"\x00":
            return load_array(parts, self._policy)
        if self._policy is None:
            if len(parts) == 1:
                return pickle.loads(parts[0])
            return _as_sent(pickle.loads(parts[0], buffers=parts[1:]))
        return self.load(Stream(parts))

    def load(self, stream: Stream) -> Any:
        """Unpickle a stream made by :meth:`dump` (or rebuilt from its chunks by a transport).

        Does not consume ``stream``. Raises :class:`pickle.UnpicklingError` on an empty stream
        or a global forbidden by ``restrict``.
        """
        if stream.empty():
            raise pickle.UnpicklingError("cannot load an empty stream")
        data = stream.peekchunk()
        if data[:1] == b"\x00":
            return load_array(list(stream), self._policy)
        buffers = [_load_buffer(view) for view in islice(stream, 1, None)]
        if self._policy is None:
            return _as_sent(pickle.loads(data, buffers=buffers))
        return _as_sent(RestrictedUnpickler(_load_buffer(data), self._policy, buffers).load())

    def __repr__(self) -> str:
        restrict = None if self._restrict is None else sorted(self._restrict)
        return (
            f"PickleSerializer(restrict={restrict!r}, copy_threshold={self._copy_threshold}, "
            f"protocol={self._protocol})"
        )


DEFAULT_SERIALIZER: PickleSerializer = PickleSerializer()
"""Unrestricted pickle: only for peers you trust (they can run code in your process)."""
