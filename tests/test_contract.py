"""The transport contract (netq/contract.py) stays typed: no ``Any`` anywhere in it, and a
transport refuses, with a TypeError, a link that is not its own kind."""

from __future__ import annotations

import ast
import inspect
import typing

import pytest

from netq import contract
from netq.session import PeerSession
from netq.transports.packets import PacketLink, PacketTransport
from netq.transports.sockets import SocketLink, _socket_link
from protocol.helpers import open_pair  # tests/protocol (tests/ is on sys.path)


def _names_any(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "Any":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "Any":
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            # A string annotation or type alias ("tuple[str, int] | ...") is parsed too.
            try:
                parsed = ast.parse(sub.value, mode="eval")
            except SyntaxError:
                continue  # a docstring, not a type
            if _names_any(parsed):
                return True
    return False


def test_the_contract_module_never_imports_or_names_any() -> None:
    tree = ast.parse(inspect.getsource(contract))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "Any" for alias in node.names):
            found.append(f"line {node.lineno}: imports Any")
        annotations: list[ast.AST] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                             arguments.vararg, arguments.kwarg]:
                if argument is not None and argument.annotation is not None:
                    annotations.append(argument.annotation)
            if node.returns is not None:
                annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
            if node.value is not None:
                annotations.append(node.value)  # a type alias's value
        found += [f"line {annotation.lineno}: {ast.unparse(annotation)}"
                  for annotation in annotations if _names_any(annotation)]
    assert not found, f"Any in netq/contract.py's annotations: {found}"


@pytest.mark.parametrize("cls", [contract.LinkIO, contract.Link, contract.EngineAPI,
                                 contract.TransportAPI, contract.Inbox])
def test_every_resolved_hint_of_the_contract_classes_is_free_of_any(cls: type) -> None:
    def hints_of(member: object) -> dict[str, object]:
        try:
            # The names the contract imports only for type checkers, too.
            return typing.get_type_hints(member, {**vars(contract), "PeerSession": PeerSession})
        except TypeError:
            return {}  # not annotatable (a slot descriptor, a non-function attribute)

    members: list[object] = [cls]
    for value in vars(cls).values():
        members.append(value.fget if isinstance(value, property) else value)
    for member in members:
        for name, hint in hints_of(member).items():
            assert "typing.Any" not in repr(hint), f"{cls.__name__}: {name}: {hint!r}"


def test_a_transport_refuses_a_link_of_another_kind_with_a_type_error() -> None:
    pair = open_pair()
    bare = contract.Link(pair.server, "memory")
    with pytest.raises(TypeError, match="does not own"):
        _socket_link(bare)
    with pytest.raises(TypeError, match="does not own"):
        PacketTransport._packet_link(bare)
    packet_link = PacketLink(object(), pair.client, "memory")
    assert PacketTransport._packet_link(packet_link) is packet_link
    with pytest.raises(TypeError, match="does not own"):
        _socket_link(packet_link)
    assert not isinstance(packet_link, SocketLink)
