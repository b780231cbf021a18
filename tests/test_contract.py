"""The contracts stay typed: no ``Any`` anywhere in netq/contract.py (engine and loop) nor in
netq/carrier.py (loop and carriers)."""

from __future__ import annotations

import ast
import inspect
import typing

import pytest

from netq import carrier, contract
from netq.session import PeerSession


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


@pytest.mark.parametrize("module", [contract, carrier], ids=lambda module: module.__name__)
def test_the_contract_modules_never_import_or_name_any(module) -> None:
    tree = ast.parse(inspect.getsource(module))
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
    assert not found, f"Any in {module.__name__}'s annotations: {found}"


@pytest.mark.parametrize("cls", [contract.LinkIO, contract.Link, contract.EngineAPI,
                                 contract.LoopAPI, contract.Inbox, carrier.Carrier,
                                 carrier.CarrierInfo, carrier.Opened])
def test_every_resolved_hint_of_the_contract_classes_is_free_of_any(cls: type) -> None:
    def hints_of(member: object) -> dict[str, object]:
        try:
            # The names the contract imports only for type checkers, too.
            return typing.get_type_hints(member, {**vars(contract), **vars(carrier),
                                                  "PeerSession": PeerSession})
        except TypeError:
            return {}  # not annotatable (a slot descriptor, a non-function attribute)

    members: list[object] = [cls]
    for value in vars(cls).values():
        members.append(value.fget if isinstance(value, property) else value)
    for member in members:
        for name, hint in hints_of(member).items():
            assert "typing.Any" not in repr(hint), f"{cls.__name__}: {name}: {hint!r}"
