"""Zero-copy byte streams and the serializers that produce and consume them.

The chunk model
---------------
A message travels as a :class:`Stream`: an ordered list of *chunks*, each a flat, C-contiguous
``memoryview`` of unsigned bytes (format ``"B"``) over someone else's memory. Writing a chunk
takes a view of the buffer and reading one hands that view back; neither copies. The transport
sends every chunk as a separate part, and the receiver rebuilds a :class:`Stream` whose chunks
view *the exact receive buffers*: a ``bytearray`` where the sender's chunk was writable; where
it was read-only, a ``bytes`` object below 64 KiB (copied out of the link's staging buffer) and
from 64 KiB a read-only ``memoryview`` of the buffer it was received into, with no copy
(``netq._buffers``). :meth:`Stream.tobytes` is the one operation that copies.

Because chunks are views, whatever owns the memory must not change it until the stream has
been sent, and memory seen through a received stream belongs to the object that was loaded
from it. Empty chunks are dropped on write: a zero-length part carries nothing and would only
cost a frame.

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
  back as a writable copy.

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
import io
import mmap
import pickle
import struct
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, ClassVar, NamedTuple, Protocol, TypeAlias, runtime_checkable

__all__ = (
    "Buffer",
    "Stream",
    "Serializer",
    "BytesSerializer",
    "PickleSerializer",
    "DEFAULT_SERIALIZER",
)

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    # Python 3.11 has no way to spell "supports the buffer protocol" in a type hint. For
    # annotations only: isinstance(x, Buffer) works on 3.12+ alone.
    Buffer: TypeAlias = Any


def _as_view(buffer: Buffer) -> memoryview:
    # A fresh view even for memoryview inputs: it shares the caller's buffer, but survives the
    # caller releasing its own view (``with memoryview(x) as v: stream.writechunk(v)``).
    kind = type(buffer)
    if kind is bytes or kind is bytearray:
        return memoryview(buffer)  # always flat "B": no checks needed
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise TypeError(
            f"Stream chunks must be C-contiguous buffers; got a non-contiguous "
            f"{type(buffer).__name__} (make a contiguous copy first)"
        )
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _reject_single_buffer(chunks: object) -> None:
    # A buffer is often also an iterable (of ints, of numpy scalars, which are buffers too), so
    # Stream(b"abc") would fail on the first int, or worse, Stream(np_array) would make one
    # chunk per element. Say what was meant instead.
    if type(chunks) in (list, tuple, deque):
        return
    try:
        memoryview(chunks)  # type: ignore[arg-type]
    except TypeError:
        return
    raise TypeError(
        f"expected an iterable of buffers, got a single {type(chunks).__name__}; use "
        f"Stream.frombytes(data) or writechunk(data)"
    )


_NO_CHUNKS: tuple[()] = ()


class Stream:
    """A FIFO of ``memoryview`` chunks: a zero-copy, non-blocking pipe of bytes.

    ``Stream(chunks)`` starts with a view of each buffer in ``chunks``. Chunks accept any
    C-contiguous buffer (``bytes``, ``bytearray``, ``memoryview``, ``array.array``, numpy
    arrays...) and are stored as flat unsigned-byte views; nothing is copied on write or read.
    Zero-length buffers are ignored. ``len(stream)`` is the number of bytes; iterating yields
    the chunks without consuming them. As a context manager the stream is cleared on exit,
    dropping its references to the underlying buffers (views already handed out stay valid).
    """

    __slots__ = ("_chunks", "_nbytes")

    _chunks: deque[memoryview]
    _nbytes: int

    def __init__(self, chunks: Iterable[Buffer] = _NO_CHUNKS) -> None:
        self._chunks = deque()
        self._nbytes = 0
        if chunks is not _NO_CHUNKS:
            self.writechunks(chunks)

    @classmethod
    def frombytes(cls, data: Buffer) -> Stream:
        """A stream of one chunk viewing ``data`` (no copy; empty ``data``: an empty stream)."""
        stream = cls()
        stream.writechunk(data)
        return stream

    # -- size -----------------------------------------------------------------------------

    @property
    def nchunks(self) -> int:
        """Number of chunks."""
        return len(self._chunks)

    @property
    def nbytes(self) -> int:
        """Total number of bytes over all chunks."""
        return self._nbytes

    def empty(self) -> bool:
        """True when the stream holds no chunks (and so no bytes)."""
        return not self._chunks

    def __len__(self) -> int:
        return self._nbytes

    # -- writing --------------------------------------------------------------------------

    def writechunk(self, buffer: Buffer) -> None:
        """Append a view of ``buffer`` as the last chunk (ignored when it is empty)."""
        view = _as_view(buffer)
        nbytes = view.nbytes
        if nbytes:
            self._chunks.append(view)
            self._nbytes += nbytes

    def writechunks(self, buffers: Iterable[Buffer]) -> None:
        """Append a view of every buffer in ``buffers``, in order."""
        if isinstance(buffers, Stream):
            self.update(buffers)
            return
        _reject_single_buffer(buffers)
        append = self._chunks.append
        total = 0
        for buffer in buffers:
            view = _as_view(buffer)
            nbytes = view.nbytes
            if nbytes:
                append(view)
                total += nbytes
        self._nbytes += total

    def unwritechunk(self) -> memoryview:
        """Remove and return the last chunk."""
        if not self._chunks:
            raise IndexError("unwritechunk() from an empty Stream")
        view = self._chunks.pop()
        self._nbytes -= view.nbytes
        return view

    def update(self, other: Stream | Iterable[Buffer]) -> None:
        """Append every chunk of ``other``; a Stream ``other`` is left unchanged.

        The views are shared with ``other``, not copied.
        """
        if isinstance(other, Stream):
            # deque.extend copes with other being self (it snapshots its argument first).
            self._chunks.extend(other._chunks)
            self._nbytes += other._nbytes
        else:
            self.writechunks(other)

    # -- reading --------------------------------------------------------------------------

    def readchunk(self) -> memoryview:
        """Remove and return the first chunk."""
        if not self._chunks:
            raise IndexError("readchunk() from an empty Stream")
        view = self._chunks.popleft()
        self._nbytes -= view.nbytes
        return view

    def unreadchunk(self, buffer: Buffer) -> None:
        """Push a view of ``buffer`` back as the first chunk (ignored when it is empty)."""
        view = _as_view(buffer)
        nbytes = view.nbytes
        if nbytes:
            self._chunks.appendleft(view)
            self._nbytes += nbytes

    def peekchunk(self) -> memoryview:
        """The first chunk, left in place."""
        if not self._chunks:
            raise IndexError("peekchunk() on an empty Stream")
        return self._chunks[0]

    def readchunks(self) -> list[memoryview]:
        """Remove and return all chunks."""
        chunks = list(self._chunks)
        self._chunks.clear()
        self._nbytes = 0
        return chunks

    def clear(self) -> None:
        """Drop every chunk."""
        self._chunks.clear()
        self._nbytes = 0

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self._chunks)

    # -- copies ---------------------------------------------------------------------------

    def copy(self) -> Stream:
        """A new stream sharing this one's views (a shallow copy: no bytes are copied)."""
        cls = type(self)
        new = cls.__new__(cls)
        new._chunks = self._chunks.copy()
        new._nbytes = self._nbytes
        return new

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> Stream:
        # memoryviews cannot be deep-copied generically; copy each chunk's bytes, keeping the
        # chunk boundaries and each chunk's writability.
        cls = type(self)
        new = cls.__new__(cls)
        new._chunks = deque(
            memoryview(bytes(view) if view.readonly else bytearray(view)) for view in self._chunks
        )
        new._nbytes = self._nbytes
        return new

    def tobytes(self) -> bytes:
        """All bytes joined into one ``bytes`` object.

        This copies, except when the stream is a single chunk covering a whole ``bytes``
        object: that object is returned as is (it is immutable, so sharing it is safe).
        """
        chunks = self._chunks
        if len(chunks) == 1:
            view = chunks[0]
            obj = view.obj
            if type(obj) is bytes and len(obj) == view.nbytes:
                return obj
        return b"".join(chunks)

    __bytes__ = tobytes

    # -- protocol -------------------------------------------------------------------------

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nchunks={len(self._chunks)}, nbytes={self._nbytes})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Stream):
            return self._nbytes == other._nbytes and self.tobytes() == other.tobytes()
        try:
            view = memoryview(other)  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented
        return self._nbytes == view.nbytes and self.tobytes() == view.tobytes()

    # Mutable and compared by content.
    __hash__ = None  # type: ignore[assignment]


# Types whose pickles never contain out-of-band buffers.
_NO_BUFFERS = frozenset((bytes, str, int, float, bool, type(None), complex))


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
        view = _as_view(data)
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


class _Policy:
    """The compiled form of ``restrict``: exact global names and whole modules."""

    __slots__ = ("names", "modules")

    def __init__(self, names: frozenset[str], modules: tuple[str, ...]) -> None:
        self.names = names
        self.modules = modules

    def owns(self, module: str) -> bool:
        """Whether ``module`` is an allowed module or one of their submodules."""
        for allowed in self.modules:
            if module == allowed or module.startswith(allowed + "."):
                return True
        return False

    def may_import(self, module: str) -> bool:
        # Importing runs the module: pkg.__main__ would run a program. Only the part below
        # the allowed module is checked, so an explicit "__main__" entry still works.
        for allowed in self.modules:
            if module == allowed:
                return True
            if module.startswith(allowed + "."):
                below = module[len(allowed) + 1 :].split(".")
                if not any(_is_dunder(part) for part in below):
                    return True
        return False

    def find_class(self, unpickler: pickle.Unpickler, module: str, name: str) -> Any:
        if f"{module}.{name}" in self.names:
            return pickle.Unpickler.find_class(unpickler, module, name)
        # A dotted name is an attribute path: load.__builtins__.get would reach eval.
        if self.may_import(module) and not any(_is_dunder(part) for part in name.split(".")):
            found = pickle.Unpickler.find_class(unpickler, module, name)
            # A module's namespace also holds what it imported (logging.os.system); only
            # what the allowed modules define themselves is allowed.
            owner = getattr(found, "__module__", None)
            if isinstance(owner, str) and self.owns(owner):
                return found
        raise pickle.UnpicklingError(f"global '{module}.{name}' is forbidden by restrict")


def _is_dunder(part: str) -> bool:
    return len(part) > 4 and part.startswith("__") and part.endswith("__")


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: Any, policy: _Policy, buffers: list[Any]) -> None:
        # fix_imports=False: the names checked are exactly the names imported.
        super().__init__(io.BytesIO(data), fix_imports=False, buffers=buffers)
        self._policy = policy

    def find_class(self, module: str, name: str) -> Any:
        return self._policy.find_class(self, module, name)


# numpy arrays skip pickle: a fixed header (magic, order, ndim, dtype length), the dtype's
# ``.str`` in ASCII, then the shape as unsigned 64-bit counts; the array's bytes follow in the
# same part when small, else travel as the next part (out of band). A pickle's first byte is
# always PROTO (0x80), so the magic's leading NUL tells the two forms apart.
ARRAY_MAGIC = b"\x00nqA"
_ARRAY_HEAD = struct.Struct("<4sBBB")  # magic, order (0: C, 1: Fortran), ndim, len(dtype.str)
_ARRAY_MAX_DTYPE = 32  # bytes of dtype.str, e.g. "<M8[ns]"; longer is refused unparsed
_ARRAY_MAX_NDIM = 64  # numpy's own limit (NPY_MAXDIMS)


def _array_parts(array: Any, threshold: int) -> tuple[Any, ...] | None:
    """The header-and-bytes form of a plain numpy array, or None where pickle must do it:
    object or structured dtypes, subclasses (the caller checks the exact type), and arrays
    that are neither C- nor Fortran-contiguous (pickle copies those anyway)."""
    dtype = array.dtype
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        return None
    flags = array.flags
    if flags.c_contiguous:
        order = 0
    elif flags.f_contiguous:
        order = 1
    else:
        return None
    code = dtype.str.encode("ascii")
    shape = array.shape
    header = (_ARRAY_HEAD.pack(ARRAY_MAGIC, order, len(shape), len(code)) + code
              + struct.pack(f"<{len(shape)}Q", *shape))
    if dtype.kind in "mM":  # datetimes export no buffer: their bytes as uint8, still no copy
        array = array.reshape(-1, order="A").view("u1")
    raw = pickle.PickleBuffer(array).raw()  # flat bytes in memory order, no copy
    if raw.nbytes >= threshold and raw.nbytes:
        return (header, raw)
    return (header + raw,)  # one part: a small copy costs less than a second part


class _ArrayLayout(NamedTuple):
    """What an array header's fixed fields and dtype say, parsed once per distinct header."""

    dtype: Any  # numpy.dtype
    order: str  # "C" or "F"
    shape: struct.Struct  # the shape's counts
    size: int  # bytes of the whole header


# Parsed headers by their bytes up to the shape (a process sends few distinct dtypes); a peer
# that sends many distinct ones only makes the cache start over.
_ARRAY_LAYOUTS: dict[bytes, _ArrayLayout] = {}
_ARRAY_LAYOUTS_MAX = 256


def _array_layout(head: Any, numpy: Any) -> _ArrayLayout:
    """The layout a received first part announces; ValueError says what is wrong. Reads only
    what the header's own fixed fields allow, so a lying header cannot make it read or
    allocate more."""
    nbytes = len(head)
    if nbytes < _ARRAY_HEAD.size:
        raise ValueError(f"numpy array header truncated: {nbytes} bytes")
    prefix = bytes(head[:_ARRAY_HEAD.size + head[_ARRAY_HEAD.size - 1]])
    layout = _ARRAY_LAYOUTS.get(prefix)
    if layout is not None:
        return layout
    magic, order, ndim, code_size = _ARRAY_HEAD.unpack_from(prefix)
    if magic != ARRAY_MAGIC:
        raise ValueError("not a netq numpy array header")
    if order > 1:
        raise ValueError(f"numpy array header: order {order} is neither C (0) nor Fortran (1)")
    if ndim > _ARRAY_MAX_NDIM or code_size > _ARRAY_MAX_DTYPE or not code_size:
        raise ValueError(f"numpy array header: {ndim} dimensions, dtype of {code_size} bytes "
                         f"(at most {_ARRAY_MAX_NDIM} and 1-{_ARRAY_MAX_DTYPE})")
    if len(prefix) < _ARRAY_HEAD.size + code_size:
        raise ValueError(f"numpy array header truncated: {nbytes} bytes")
    try:
        code = prefix[_ARRAY_HEAD.size:].decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("numpy array header: the dtype is not ASCII") from None
    try:
        dtype = numpy.dtype(code)
    except TypeError:
        raise ValueError(f"numpy array header: {code!r} is not a dtype") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"numpy array header: dtype {code!r} is not a plain dtype")
    layout = _ArrayLayout(dtype, "F" if order else "C", struct.Struct(f"<{ndim}Q"),
                          len(prefix) + 8 * ndim)
    if len(_ARRAY_LAYOUTS) >= _ARRAY_LAYOUTS_MAX:
        _ARRAY_LAYOUTS.clear()
    _ARRAY_LAYOUTS[prefix] = layout
    return layout


def _load_array(parts: Sequence[Any], policy: _Policy | None) -> Any:
    """Rebuild a numpy array from :func:`_array_parts`'s form, validating every field."""
    if policy is not None and not ("numpy.ndarray" in policy.names or policy.owns("numpy")):
        raise pickle.UnpicklingError("global 'numpy.ndarray' is forbidden by restrict "
                                     "(the peer sent a numpy array)")
    try:
        # Not sys.modules.get("numpy"): while another thread imports numpy, sys.modules holds
        # it half made (no dtype yet), and the import statement waits for that import to end.
        import numpy as imported  # only a peer that sends arrays needs numpy here
    except ImportError:
        raise ValueError("the peer sent a numpy array and numpy is not installed") from None
    numpy: Any = imported  # checked field by field below, not by numpy's stubs
    head = parts[0]
    if type(head) is memoryview and head.format != "B":
        head = head.cast("B")
    layout = _array_layout(head, numpy)
    size = layout.size
    if len(head) < size:
        raise ValueError(f"numpy array header truncated: {len(head)} of {size} bytes")
    shape = layout.shape.unpack_from(head, size - layout.shape.size)
    count = 1
    for extent in shape:
        count *= extent
    dtype = layout.dtype
    expected = count * dtype.itemsize
    if len(parts) == 1:  # in band, after the header
        if len(head) - size != expected:
            raise ValueError(f"numpy array header says {expected} bytes ({dtype.str} {shape}), "
                             f"{len(head) - size} arrived")
        # A copy: the array must not share the first part's (read-only) memory.
        return numpy.frombuffer(head, dtype, count, size).reshape(
            shape, order=layout.order).copy(order="K")
    if len(parts) != 2:
        raise ValueError(f"numpy array message of {len(parts)} parts (1 or 2)")
    if len(head) != size:
        raise ValueError("numpy array header: trailing bytes after the shape")
    data = parts[1]
    if type(data) is not memoryview or data.format != "B":
        data = memoryview(data).cast("B")
    if data.nbytes != expected:
        raise ValueError(f"numpy array header says {expected} bytes ({dtype.str} {shape}), "
                         f"{data.nbytes} arrived")
    # Out of band: the array is the receive buffer itself (writable when it is).
    return numpy.frombuffer(data, dtype).reshape(shape, order=layout.order)


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
            self._policy: _Policy | None = None
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
            self._policy = _Policy(frozenset(names), tuple(sorted(modules)))

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
        if numpy is not None and kind is getattr(numpy, "ndarray", None):  # as in dump_parts
            parts = _array_parts(obj, threshold)
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
        stream = Stream()
        chunks = stream._chunks
        chunks.append(memoryview(data))
        nbytes = len(data)
        for view in views:
            chunks.append(view)
            nbytes += view.nbytes
        stream._nbytes = nbytes
        return stream

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
        if numpy is not None and kind is getattr(numpy, "ndarray", None):
            parts = _array_parts(obj, self._copy_threshold)
            if parts is not None:
                return parts
        return [chunk if index else bytes(chunk) if chunk.nbytes < 4096 else chunk
                for index, chunk in enumerate(self.dump(obj)._chunks)]

    def load_parts(self, parts: list) -> Any:
        """:meth:`load` from a plain list of received buffers."""
        if parts and parts[0][:1] == b"\x00":
            return _load_array(parts, self._policy)
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
        chunks = stream._chunks
        if not chunks:
            raise pickle.UnpicklingError("cannot load an empty stream")
        data = chunks[0]
        if data[:1] == b"\x00":
            return _load_array(list(chunks), self._policy)
        buffers = [_load_buffer(view) for view in islice(chunks, 1, None)]
        if self._policy is None:
            return _as_sent(pickle.loads(data, buffers=buffers))
        return _as_sent(_RestrictedUnpickler(_load_buffer(data), self._policy, buffers).load())

    def __repr__(self) -> str:
        restrict = None if self._restrict is None else sorted(self._restrict)
        return (
            f"PickleSerializer(restrict={restrict!r}, copy_threshold={self._copy_threshold}, "
            f"protocol={self._protocol})"
        )


DEFAULT_SERIALIZER: PickleSerializer = PickleSerializer()
"""Unrestricted pickle: only for peers you trust (they can run code in your process)."""
