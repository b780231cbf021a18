"""The layers import downward only: the engine and the transports meet in netq.contract.

Read from the source (ast), so a lazy import inside a function counts too, and checked the way
a newcomer would read the map in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import netq

PACKAGE = Path(netq.__file__).parent
# The decision modules the engine is made of, and the engine: none may import a transport.
ENGINE_SIDE = ("engine", "contract", "session", "flow", "peers", "credit", "diagnostics",
               "handshake", "inbox", "protocol")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("netq", *parts[:-1])) + ".__init__" if parts[-1] == "__init__" \
        else ".".join(("netq", *parts))


def imported_modules(path: Path) -> set[str]:
    return imports_of(path.read_text(), module_name(path))


def imports_of(text: str, module: str) -> set[str]:
    """Absolute names of the netq modules the source ``text`` of ``module`` imports."""
    package = module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            name = node.module or ""
            full = (f"{base}.{name}" if name else base) if node.level else name
            found.add(full)
            found.update(f"{full}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "netq" or name.startswith("netq.")}


def sources(*names: str) -> list[Path]:
    paths: list[Path] = []
    for name in names:
        target = PACKAGE / name
        paths.extend(sorted(target.rglob("*.py")) if target.is_dir()
                     else [target.with_suffix(".py")] if target.with_suffix(".py").exists()
                     else [])
    return paths


def test_the_engine_side_imports_no_transport():
    for path in sources(*ENGINE_SIDE):
        upward = sorted(name for name in imported_modules(path)
                        if name.startswith("netq.transports") or name == "netq.communicator")
        assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}"


def test_transports_import_no_engine():
    paths = sources("transports")
    assert len(paths) > 5  # the sockets, packets, MQTT and gRPC modules are all looked at
    for path in paths:
        upward = sorted(name for name in imported_modules(path)
                        if name.startswith(("netq.engine", "netq.communicator", "netq.peers",
                                            "netq.credit", "netq.diagnostics", "netq.handshake",
                                            "netq.inbox")))
        assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}"


def test_the_contract_imports_neither_side():
    names = imported_modules(PACKAGE / "contract.py")
    assert not [name for name in names
                if name.startswith(("netq.engine", "netq.transports", "netq.communicator"))]


def test_the_check_sees_an_upward_import():
    """The checker itself: upward imports, relative and lazy, are found."""
    text = "from ..engine import SessionEngine\n\ndef f():\n    from .. import communicator\n"
    names = imports_of(text, "netq.transports.probe")
    assert {"netq.engine", "netq.communicator"} <= names
    assert "netq.transports.base" in imports_of("from .base import Link", "netq.transports.x")
    assert "netq.contract" in imports_of("from .contract import Link", "netq.engine")


# The most lines a class may span: the facade and the engine stay readable in one sitting;
# whatever grows past that is a decision of its own, with its own module.
FACADE_AND_ENGINE_LINES = 450
CLASS_LINES = 700


def class_sizes() -> dict[str, int]:
    sizes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                name = f"{path.relative_to(PACKAGE)}:{node.name}"
                sizes[name] = node.end_lineno - node.lineno + 1
    return sizes


def test_no_class_outgrows_one_decision():
    sizes = class_sizes()
    for name in ("engine.py:SessionEngine", "communicator.py:Communicator"):
        assert sizes[name] <= FACADE_AND_ENGINE_LINES, (name, sizes[name])
    too_big = {name: size for name, size in sizes.items() if size > CLASS_LINES}
    assert not too_big, too_big
