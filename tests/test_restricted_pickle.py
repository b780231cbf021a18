"""Tests of netq.restricted_pickle: what ``PickleSerializer(restrict=...)`` lets a pickle load."""

from __future__ import annotations

import collections
import os
import pickle
import sys

import numpy as np
import pytest

from netq.serializers import PickleSerializer
from netq.stream import Stream
from serializers_testing import POINT, THRESHOLD, Point, global_pickle, transmit


class Evil:
    """Unpickling this runs ``action(*args)``, which creates ``path``."""

    def __init__(self, action: object, args: tuple[object, ...]) -> None:
        self.action = action
        self.args = args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.action, self.args


def evil_payloads(path: str) -> list[Evil]:
    return [
        Evil(os.system, (f"touch {path}",)),
        Evil(exec, (f"open({path!r}, 'w').close()",)),
        Evil(eval, (f"open({path!r}, 'w').close()",)),
        Evil(open, (path, "w")),
    ]


# --------------------------------------------------------------------------------------------
# PickleSerializer: restrict
# --------------------------------------------------------------------------------------------


def test_safe_builtins_are_data_only() -> None:
    safe = PickleSerializer.SAFE_BUILTINS
    for name in ("complex", "slice", "range", "ValueError"):
        assert f"builtins.{name}" in safe
    for name in (
        "bytes", "bytearray", "list", "dict", "set", "frozenset",  # built by opcodes instead
        "eval", "exec", "getattr", "setattr", "__import__", "open", "compile", "globals",
        "vars", "type", "input", "breakpoint", "print", "delattr", "__build_class__",
    ):  # fmt: skip
        assert f"builtins.{name}" not in safe
    assert all(name.startswith("builtins.") for name in safe)


@pytest.mark.parametrize(
    "obj",
    [
        complex(1, 2),
        range(1, 10, 3),
        slice(1, None, 2),
        {1, 2},
        frozenset({3}),
        bytearray(b"ab"),
        Ellipsis,
        NotImplemented,
        {"nested": [(1, 2.0, "three", b"four", None, True)]},
    ],
    ids=repr,
)
def test_restrict_builtins_admits_safe_builtins(obj: object) -> None:
    ser = PickleSerializer(restrict=["builtins"])
    assert ser.load(transmit(ser.dump(obj))) == obj


def test_restrict_builtins_admits_exceptions() -> None:
    ser = PickleSerializer(restrict=["builtins"])
    out = ser.load(ser.dump(ValueError("bad", 3)))
    assert type(out) is ValueError and out.args == ("bad", 3)


def test_restrict_builtins_is_only_the_safe_ones() -> None:
    ser = PickleSerializer(restrict=["builtins"])
    for name in ("getattr", "eval", "exec", "open", "__import__", "compile"):
        with pytest.raises(pickle.UnpicklingError, match=f"builtins.{name}"):
            ser.load(Stream.frombytes(global_pickle("builtins", name)))


def test_a_builtin_listed_by_name_is_allowed() -> None:
    ser = PickleSerializer(restrict=["builtins", "builtins.getattr"])
    assert ser.load(Stream.frombytes(global_pickle("builtins", "getattr"))) is getattr
    with pytest.raises(pickle.UnpicklingError):
        ser.load(Stream.frombytes(global_pickle("builtins", "eval")))


@pytest.mark.parametrize(
    "restrict",
    [
        ["builtins"],
        ["builtins", "numpy"],
        sorted(PickleSerializer.NUMPY_GLOBALS),
        ["collections.OrderedDict", POINT],
        [],
    ],
    ids=["builtins", "builtins+numpy", "numpy-globals", "exact-names", "nothing"],
)
def test_malicious_pickles_execute_nothing(tmp_path: object, restrict: list[str]) -> None:
    path = os.path.join(str(tmp_path), "pwned")
    ser = PickleSerializer(restrict=restrict)
    for evil in evil_payloads(path):
        stream = PickleSerializer().dump(evil)
        name = f"{evil.action.__module__}.{evil.action.__qualname__}"  # type: ignore[attr-defined]
        with pytest.raises(pickle.UnpicklingError, match=name):
            ser.load(transmit(stream))
        assert not os.path.exists(path)


def test_malicious_pickles_do_run_when_unrestricted(tmp_path: object) -> None:
    # The control for the test above: each payload really creates the file.
    path = os.path.join(str(tmp_path), "pwned")
    for evil in evil_payloads(path):
        result = PickleSerializer().load(PickleSerializer().dump(evil))
        if hasattr(result, "close"):
            result.close()
        assert os.path.exists(path), evil.action
        os.remove(path)


def test_restrict_exact_names() -> None:
    ser = PickleSerializer(restrict=["collections.OrderedDict", POINT])
    assert ser.load(ser.dump(collections.OrderedDict(a=1))) == {"a": 1}
    assert ser.load(ser.dump(Point(3, 4))) == Point(3, 4)  # plain classes need no copyreg
    with pytest.raises(pickle.UnpicklingError, match="collections.Counter"):
        ser.load(ser.dump(collections.Counter("aab")))
    with pytest.raises(pickle.UnpicklingError, match="Point"):
        PickleSerializer(restrict=["builtins"]).load(ser.dump(Point(3, 4)))


def test_restrict_module_admits_submodules_but_not_lookalikes() -> None:
    ser = PickleSerializer(restrict=["collections"])
    assert ser.load(ser.dump(collections.OrderedDict(a=1))) == {"a": 1}
    abc = sys.modules["collections.abc"]
    assert ser.load(ser.dump(abc.Mapping)) is abc.Mapping
    lookalike = PickleSerializer(restrict=["collection"])
    with pytest.raises(pickle.UnpicklingError):
        lookalike.load(ser.dump(collections.OrderedDict(a=1)))


def test_allowed_module_cannot_leak_what_it_imported() -> None:
    # logging does "import os": logging.os.system is os.system.
    leak = Stream.frombytes(global_pickle("logging", "os.system"))
    assert PickleSerializer().load(leak) is os.system  # the attack is real
    with pytest.raises(pickle.UnpicklingError, match="logging.os.system"):
        PickleSerializer(restrict=["logging"]).load(leak)


def test_allowed_module_cannot_reach_builtins_through_dunders() -> None:
    leak = Stream.frombytes(global_pickle("numpy", "load.__builtins__"))
    assert PickleSerializer().load(leak)["eval"] is eval  # the attack is real
    with pytest.raises(pickle.UnpicklingError, match="__builtins__"):
        PickleSerializer(restrict=["numpy"]).load(leak)


def test_allowed_module_refuses_dunder_attribute_paths() -> None:
    # Counter.__init__ is defined in collections, so only the dunder rule stops this path.
    path = Stream.frombytes(global_pickle("collections", "Counter.__init__"))
    assert PickleSerializer().load(path) is collections.Counter.__init__
    with pytest.raises(pickle.UnpicklingError, match="Counter.__init__"):
        PickleSerializer(restrict=["collections"]).load(path)


def test_allowed_module_does_not_import_dunder_submodules() -> None:
    assert "unittest.__main__" not in sys.modules
    with pytest.raises(pickle.UnpicklingError, match="unittest.__main__"):
        PickleSerializer(restrict=["unittest"]).load(
            Stream.frombytes(global_pickle("unittest.__main__", "main"))
        )
    assert "unittest.__main__" not in sys.modules


@pytest.mark.parametrize(
    "restrict",
    [["numpy", "builtins"], sorted(PickleSerializer.NUMPY_GLOBALS)],
    ids=["numpy-module", "numpy-globals"],
)
def test_restrict_admits_numpy(restrict: list[str]) -> None:
    ser = PickleSerializer(restrict=restrict)
    payload = [
        np.arange(5, dtype=np.float32),
        np.arange(THRESHOLD, dtype=np.uint16),
        np.float64(2.5),
        np.int8(-3),
        np.dtype(">i4"),
        np.array([1, 2, None], dtype=object),
    ]
    out = ser.load(transmit(ser.dump(payload)))
    np.testing.assert_array_equal(out[0], payload[0])
    np.testing.assert_array_equal(out[1], payload[1])
    assert out[2] == 2.5 and type(out[2]) is np.float64
    assert out[3] == -3 and type(out[3]) is np.int8
    assert out[4] == np.dtype(">i4")
    assert list(out[5]) == [1, 2, None]


def test_numpy_globals_do_not_trust_all_of_numpy() -> None:
    ser = PickleSerializer(restrict=sorted(PickleSerializer.NUMPY_GLOBALS))
    with pytest.raises(pickle.UnpicklingError, match="numpy.savetxt"):
        ser.load(Stream.frombytes(global_pickle("numpy", "savetxt")))
