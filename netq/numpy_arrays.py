"""numpy arrays without pickle: a plain top-level array travels as a small header (dtype, shape,
order) and its bytes (:func:`array_parts`), and is rebuilt from them, every field of the
header validated (:func:`load_array`). docs/protocol.md, "What the parts hold", gives the
format; :class:`~netq.serializers.PickleSerializer` decides when it is used.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from .restricted_pickle import Policy

__all__ = ("ARRAY_MAGIC", "array_parts", "load_array", "is_plain_array")


# numpy arrays skip pickle: a fixed header (magic, order, ndim, dtype length), the dtype's
# ``.str`` in ASCII, then the shape as unsigned 64-bit counts; the array's bytes follow in the
# same part when small, else travel as the next part (out of band). A pickle's first byte is
# always PROTO (0x80), so the magic's leading NUL tells the two forms apart.
ARRAY_MAGIC = b"\x00nqA"
_ARRAY_HEAD = struct.Struct("<4sBBB")  # magic, order (0: C, 1: Fortran), ndim, len(dtype.str)
_ARRAY_MAX_DTYPE = 32  # bytes of dtype.str, e.g. "<M8[ns]"; longer is refused unparsed
_ARRAY_MAX_NDIM = 64  # numpy's own limit (NPY_MAXDIMS)


def is_plain_array(kind: type, numpy: Any) -> bool:
    """Does an object of type ``kind`` travel as :func:`array_parts` may send it: an
    ``ndarray``, or an ``np.memmap`` (an ndarray over a file's map; it arrives as a plain
    array, as its bytes are all there is to it). Other subclasses (masked arrays,
    matrices, a user's own) carry more than their bytes and go through pickle."""
    return kind is getattr(numpy, "ndarray", None) or kind is getattr(numpy, "memmap", None)


def array_parts(array: Any, threshold: int) -> tuple[Any, ...] | None:
    """The header-and-bytes form of a plain numpy array, or None where pickle must do it:
    object or structured dtypes, and arrays that are neither C- nor Fortran-contiguous
    (pickle copies those anyway). The caller checks the type (:func:`is_plain_array`)."""
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


def load_array(parts: Sequence[Any], policy: Policy | None) -> Any:
    """Rebuild a numpy array from :func:`array_parts`'s form, validating every field."""
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
