"""netq's errors (netq/exceptions.py): each one crosses a process boundary intact.

A future's exception travels where futures travel: ``multiprocessing`` and
``concurrent.futures.ProcessPoolExecutor`` results, dask, a pickled log record. Each error is
pickled with what it was made from, so the copy has the same type, text and attributes.
"""

from __future__ import annotations

import pickle
import sys
import uuid

import pytest

import netq as nq

PEER = uuid.UUID(int=7)


def _cases() -> list[tuple[BaseException, dict[str, object]]]:
    lost = nq.ConnectionLost(PEER, "killed")
    return [
        (nq.ResourceClosed(PEER, "the peer closed"), {"peer": PEER, "reason": "the peer closed"}),
        (nq.ResourceClosed(None), {"peer": None, "reason": ""}),
        (lost, {"peer": PEER, "reason": "killed"}),
        (nq.ConnectionLost(None, "no server"), {"peer": None, "reason": "no server"}),
        (nq.UsedInForkedChild(PEER, 10, 11),
         {"communicator_id": PEER, "parent_pid": 10, "child_pid": 11}),
        (nq.UnknownPeer(PEER), {"peer": PEER, "why": ""}),
        (nq.UnknownPeer(PEER, "not yours"), {"peer": PEER, "why": "not yours"}),
        (nq.ResourceGone(PEER, "either"), {"peer": PEER, "reason": "either"}),
        (nq.MessageTooLarge(10, 5), {"size": 10, "limit": 5, "peer": None}),
        (nq.MessageTooLarge(10, 5, PEER), {"size": 10, "limit": 5, "peer": PEER}),
        (nq.DeserializationError(PEER, ValueError("bad")), {"peer": PEER}),
        (nq.BroadcastIncomplete(2, 3, [(PEER, lost)]), {"delivered": 2, "addressed": 3}),
        (nq.Empty("nothing"), {}),
        (nq.RemoteProtocolError("garbage"), {}),
    ]


@pytest.mark.parametrize("error, attributes", _cases(), ids=lambda case: type(case).__name__
                         if isinstance(case, BaseException) else "")
def test_every_error_pickles_with_its_attributes(error, attributes):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    for name, value in attributes.items():
        assert getattr(copy, name) == value, name


def test_a_pickled_broadcast_failure_keeps_each_peers_error():
    error = nq.BroadcastIncomplete(1, 3, [(PEER, nq.ConnectionLost(PEER, "killed")),
                                          (None, nq.MessageTooLarge(10, 5))])
    copy = pickle.loads(pickle.dumps(error))
    assert list(copy.failed) == [PEER, None]
    assert isinstance(copy.failed[PEER], nq.ConnectionLost) and copy.failed[PEER].peer == PEER
    assert copy.failed[None].limit == 5
    assert [type(e) for e in copy.exceptions] == [nq.ConnectionLost, nq.MessageTooLarge]


def test_closed_and_broken_are_siblings_under_one_base():
    """"You closed it" (ResourceClosed) and "it broke" (ConnectionLost) are told apart by
    type, as trio's ClosedResourceError and BrokenResourceError are; ResourceGone catches
    both, for code that does not care which."""
    assert not issubclass(nq.ConnectionLost, nq.ResourceClosed)
    assert not issubclass(nq.ResourceClosed, nq.ConnectionLost)
    for error in (nq.ResourceClosed(None, "close() was called"), nq.ConnectionLost(PEER, "killed"),
                  nq.UsedInForkedChild(PEER, 10, 11)):
        with pytest.raises(nq.ResourceGone):
            raise error
        assert isinstance(error, nq.NetqError)
    assert issubclass(nq.UsedInForkedChild, nq.ResourceClosed)  # the caller's doing
    assert nq.ResourceGone.__bases__ == (nq.NetqError,)
    assert nq.ResourceClosed.__bases__ == nq.ConnectionLost.__bases__ == (nq.ResourceGone,)
    assert nq.ResourceGone is nq.exceptions.ResourceGone and "ResourceGone" in nq.__all__


def test_each_says_whose_doing_it_was():
    assert str(nq.ResourceClosed(None)) == "communicator is closed"
    assert str(nq.ConnectionLost(None, "no server")) == "connection lost: no server"
    assert str(nq.ConnectionLost(PEER, "killed")) == f"peer {PEER} is gone: killed"
    assert str(nq.MessageTooLarge(10, 5)) == "message of 10 bytes exceeds message_size=5 bytes"
    assert str(nq.MessageTooLarge(10, 5, PEER)) == \
        f"message of 10 bytes exceeds peer {PEER}'s message_size=5 bytes"


def test_the_docstring_tree_shows_closed_and_broken_side_by_side():
    tree = nq.exceptions.__doc__
    gone = tree.index("├── ResourceGone")
    closed = tree.index("│   ├── ResourceClosed")
    forked = tree.index("│   │   └── UsedInForkedChild")
    lost = tree.index("│   └── ConnectionLost")
    assert gone < closed < forked < lost


def test_a_message_that_met_a_half_imported_package_says_which_and_what_to_do(
        tmp_path, monkeypatch) -> None:
    # CPython's own text for a module met half made, produced the deterministic way: the
    # package unpickles, while it is being imported, an object of a submodule that needs a
    # name the package has not defined yet. Two threads meet it at random (gh-83065).
    package = tmp_path / "halfmade"
    package.mkdir()
    (package / "sub.py").write_text("from halfmade import READY\n\nclass Thing:\n    pass\n")
    (package / "__init__.py").write_text(
        "import pickle\n"
        "try:\n"
        "    pickle.loads(b'\\x80\\x05\\x95\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00'\n"
        "                 b'\\x8c\\x0chalfmade.sub\\x8c\\x05Thing\\x93)\\x81.')\n"
        "except ImportError as error:\n"
        "    CAUSE = error\n"
        "READY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import halfmade  # type: ignore[import-not-found]
    finally:
        sys.modules.pop("halfmade", None)

    error = nq.DeserializationError(PEER, halfmade.CAUSE)
    assert "partially initialized module 'halfmade'" in str(halfmade.CAUSE)
    assert str(error).endswith("another thread was importing halfmade at the same time: "
                               "import halfmade before starting the threads that call get()")
    assert "another thread" not in str(nq.DeserializationError(PEER, ImportError("no x")))
    assert pickle.loads(pickle.dumps(error)).args == error.args
