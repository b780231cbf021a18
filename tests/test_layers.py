"""The layers import downward only: the engine and its loop meet in netq.contract, the loop and
the transports (carriers) in netq.carrier.

Read from the source (ast), so a lazy import inside a function counts too, and checked the way
a newcomer would read the map in docs/architecture.md.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import netq
from netq import transports
from netq.carrier import Carrier

PACKAGE = Path(netq.__file__).parent
# The decision modules the engine is made of, and the engine: none may import a transport.
ENGINE_SIDE = ("engine", "loop", "link_driver", "contract", "carrier", "session", "flow",
               "peers", "credit", "diagnostics", "handshake", "inbox", "protocol")
# What no transport module may import: the engine side above the carrier interface.
ABOVE_CARRIERS = ("netq.engine", "netq.loop", "netq.link_driver", "netq.contract",
                  "netq.communicator", "netq.session", "netq.peers", "netq.credit",
                  "netq.diagnostics", "netq.handshake", "netq.inbox", "netq.flow",
                  "netq.protocol.frames",
                  "netq.protocol.resume")


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
                        if name.startswith(ABOVE_CARRIERS))
        assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}"


def test_the_carrier_interface_has_at_most_eight_members():
    members = sorted(name for name in {*vars(Carrier), *Carrier.__annotations__}
                     if not name.startswith("_"))
    assert members == ["admit", "close", "explain", "info", "read_into", "wait", "wake",
                       "write"]


def test_the_carrier_module_imports_neither_side():
    names = imported_modules(PACKAGE / "carrier.py")
    assert not [name for name in names
                if name.startswith(("netq.engine", "netq.loop", "netq.contract",
                                    "netq.transports", "netq.communicator"))]


@pytest.mark.parametrize("protocol", transports.available())
def test_every_registered_transport_is_a_carrier(protocol):
    if protocol == "grpc":
        pytest.importorskip("grpc")
    if protocol == "mqtt":
        pytest.importorskip("paho.mqtt")
    carrier_class = transports.lookup(protocol)
    for name in ("admit", "wait", "read_into", "write", "wake", "close", "explain"):
        assert callable(getattr(carrier_class, name, None)), f"{protocol}: no {name}()"
    source = Path(inspect.getsourcefile(carrier_class) or "").read_text()
    assert "self.info = CarrierInfo(" in source or any(
        "self.info = CarrierInfo(" in Path(inspect.getsourcefile(base) or "").read_text()
        for base in carrier_class.__mro__[1:] if base.__module__.startswith("netq."))


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


# ---------------------------------------------------------------- nothing below the engine calls up
# The modules below the engine: the loop, its link driver, the shared I/O thread, the carrier
# contract, the carriers and the wire. What the engine must hear from them (a link served or
# closed, a connection attempt begun or failed) they leave as data (netq.contract.LoopSignals:
# notices the engine drains once per turn), and what they read of the engine and the receive
# side is data too (the same LoopSignals). None may hold an inbox or a communicator at all.
BELOW_THE_ENGINE = ("loop", "link_driver", "shared_io", "carrier", "transports", "protocol")
# Names that hold an upper layer's object (a local, an attribute), and the upper layers' types.
ENGINE_HOLDERS = frozenset({"engine", "_engine"})
OTHER_HOLDERS = frozenset({"inbox", "_inbox", "inboxes", "_inboxes", "consumers", "_consumers",
                           "communicator", "_communicator"})
UPPER_TYPES = frozenset({"EngineAPI", "SessionEngine", "Inbox", "Inboxes", "Communicator"})
# What an engine holds that is data, not a callable: reading it is no call up.
ENGINE_DATA = frozenset({"signals"})
# Issue 56: the engine calls still made from below it, each to become data the engine drains
# (or gone). The set may only shrink: a new call up fails, and one that goes must go from here.
STILL_CALLED_UP = {
    "loop.py": {"EngineAPI", "engine.service", "engine.ended"},
    "link_driver.py": {"EngineAPI", "engine.new_connection", "engine.handle_events"},
}
# Functions a user calls with a communicator (from above, on the user's thread): they read down
# from it and are held by nothing below.
USER_HELPERS = {"transports/mqtt/transport.py": {"link_statistics"}}


def upward_reach(text: str, skip: frozenset[str] = frozenset()) -> set[str]:
    """What the source ``text`` reaches of the layers above the engine's loop: ``holder.member``
    for each member of an engine it uses (its data excepted), the holder's name for an inbox or
    communicator held at all, and the upper layers' type names it mentions (annotations in
    strings too). Top-level functions named in ``skip`` are not looked at."""
    found: set[str] = set()
    tree = ast.parse(text)
    tree.body = [node for node in tree.body
                 if not (isinstance(node, ast.FunctionDef) and node.name in skip)]

    def holder(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            held = holder(node.value)
            if held in ENGINE_HOLDERS and node.attr not in ENGINE_DATA:
                found.add(f"engine.{node.attr}")
            if node.attr in OTHER_HOLDERS:
                found.add(node.attr)
            if node.attr in UPPER_TYPES:
                found.add(node.attr)
        elif isinstance(node, ast.Name):
            if node.id in OTHER_HOLDERS or node.id in UPPER_TYPES:
                found.add(node.id)
        elif isinstance(node, ast.arg) and node.arg in OTHER_HOLDERS:
            found.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                annotation = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue  # a docstring or a message, not a type
            found.update(name.id for name in ast.walk(annotation)
                         if isinstance(name, ast.Name) and name.id in UPPER_TYPES)
    return found


def test_nothing_below_the_engine_calls_up_but_what_is_left():
    paths = sources(*BELOW_THE_ENGINE)
    assert len(paths) > 25 and PACKAGE / "transports" / "sockets.py" in paths
    reached = {}
    for path in paths:
        name = str(path.relative_to(PACKAGE))
        reach = upward_reach(path.read_text(), frozenset(USER_HELPERS.get(name, ())))
        if reach:
            reached[name] = reach
    assert reached == STILL_CALLED_UP, (
        "below the engine, only data may reach up (netq.contract.LoopSignals); what the "
        f"engine must hear is a notice it drains: {reached}")


def test_the_check_sees_a_call_up():
    """The checker itself: an engine's method called through a local or an attribute, an inbox
    or communicator held, an upper type named (in a string annotation too) are all found; the
    engine's data and a docstring are not."""
    text = '''"""The engine: a docstring."""
def opened(self, engine: "EngineAPI", link):
    engine.link_closed(link)
    self.engine.after_io(link)
    self._engine.signals.notices.append(link)
    self._consumers.consumer_waiting
def got(inbox, communicator):
    pass
'''
    assert upward_reach(text) == {"EngineAPI", "engine.link_closed", "engine.after_io",
                                  "_consumers", "inbox", "communicator"}
    assert upward_reach("def f(link: Inboxes) -> SessionEngine: ...") == {"Inboxes",
                                                                        "SessionEngine"}
    helper = "def link_statistics(communicator):\n    return communicator.loop\n"
    assert upward_reach(helper) == {"communicator"}
    assert upward_reach(helper, frozenset({"link_statistics"})) == set()
    # Appending a notice, and keeping the engine (an attribute named so), call nothing up.
    assert upward_reach("signals.notices.append((1, link, ''))\nself.engine = engine\n") == set()


# The most members EngineAPI may have (issue 56): what the loop may call on its engine, and the
# data it reads (one LoopSignals).
ENGINE_API_MEMBERS = 6


def protocol_members(text: str, name: str) -> list[str]:
    """The members a class ``name`` of the source ``text`` declares: its annotated attributes,
    methods and properties (its docstring is none)."""
    (cls,) = [node for node in ast.walk(ast.parse(text))
              if isinstance(node, ast.ClassDef) and node.name == name]
    members = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members.append(node.target.id)
        elif isinstance(node, ast.Assign):
            members.extend(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            members.append(node.name)
    return members


def test_the_engine_api_has_at_most_six_members():
    members = protocol_members((PACKAGE / "contract.py").read_text(), "EngineAPI")
    assert "signals" in members and "service" in members
    assert len(members) <= ENGINE_API_MEMBERS, members


def test_the_member_count_sees_every_kind_of_member():
    text = '''class EngineAPI(Protocol):
    """A docstring is no member."""
    options: object
    limit = 3
    @property
    def closing(self) -> bool: ...
    def service(self, now: float) -> float: ...
    async def later(self) -> None: ...
'''
    assert protocol_members(text, "EngineAPI") == ["options", "limit", "closing", "service",
                                                  "later"]


# ---------------------------------------------------------------- each session field, one writer
# Every field of a PeerSession is written by one module (its __init__, where it is declared,
# aside): a newcomer finds who changes a field in one place. A session is named ``session``
# (``server_session``, ...) or ``server`` wherever netq writes one, and ``self`` in its own
# methods; the check reads those names.
SESSION_HOLDERS = frozenset({"server", "counted"})
# Issue 56: the fields still written from two modules, with why. The set may only shrink.
MULTI_WRITER_FIELDS_LEFT = {
    # The receive numbering: per message on the engine's read path (a call into the session
    # there would be a Python call per read), and reset by PeerSession.resume on a reconnect.
    "last_received": ["engine.py", "session.py"],
}


def session_field_writers(root: Path) -> dict[str, list[str]]:
    """Field of ``root``/session.py's PeerSession -> the modules under ``root`` that write it
    (assign, augment), PeerSession.__init__ aside."""
    declared = ast.parse((root / "session.py").read_text())
    (cls,) = [node for node in declared.body
              if isinstance(node, ast.ClassDef) and node.name == "PeerSession"]
    (init,) = [node for node in cls.body
               if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    fields = {target.attr for node in ast.walk(init) for target in ast.walk(node)
              if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store)
              and isinstance(target.value, ast.Name) and target.value.id == "self"}
    writers: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root))
        source = declared if name == "session.py" else ast.parse(path.read_text())
        declaring = {id(node) for node in ast.walk(init)} if name == "session.py" else set()
        for node in ast.walk(source):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Store) \
                    or node.attr not in fields or id(node) in declaring:
                continue
            value = node.value
            holder = value.id if isinstance(value, ast.Name) else \
                value.attr if isinstance(value, ast.Attribute) else ""
            if (holder == "self" and name == "session.py") or "session" in holder \
                    or holder in SESSION_HOLDERS:
                writers.setdefault(node.attr, set()).add(name)
    return {field: sorted(modules) for field, modules in writers.items()}


def test_each_session_field_is_written_by_one_module():
    writers = session_field_writers(PACKAGE)
    assert {"next_seq", "queued_bytes", "link", "state"} <= set(writers)  # the check reads them
    shared = {field: modules for field, modules in writers.items() if len(modules) > 1}
    assert shared == MULTI_WRITER_FIELDS_LEFT, shared


def test_the_writer_check_sees_a_field_written_from_two_modules(tmp_path):
    (tmp_path / "session.py").write_text(
        "class PeerSession:\n"
        "    def __init__(self):\n        self.state = 0\n        self.seq = 0\n"
        "    def bump(self):\n        self.seq += 1\n")
    (tmp_path / "engine.py").write_text(
        "def f(session, server, link):\n    session.state = 1\n    link.seq = 2\n"
        "    server.state = 3\n")
    (tmp_path / "handshake.py").write_text(
        "def g(self, link):\n    self.server_session.state = 4\n    link.session.seq = 5\n")
    assert session_field_writers(tmp_path) == {"state": ["engine.py", "handshake.py"],
                                               "seq": ["handshake.py", "session.py"]}


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
    for name in ("engine.py:SessionEngine", "communicator.py:Communicator", "loop.py:IOLoop",
                 "link_driver.py:LinkDriver"):
        assert sizes[name] <= FACADE_AND_ENGINE_LINES, (name, sizes[name])
    too_big = {name: size for name, size in sizes.items() if size > CLASS_LINES}
    assert not too_big, too_big


# The lab (netq/lab/: relay, netem, trace, brokers, the demo) is built on the library, never the
# other way round. The command line is the one exception: it runs the demo.
LAB = "netq.lab"
COMMAND_LINE = PACKAGE / "__main__.py"


def imports_the_lab(names: set[str]) -> list[str]:
    return sorted(name for name in names if name == LAB or name.startswith(LAB + "."))


def test_the_core_imports_nothing_from_the_lab():
    lab = PACKAGE / "lab"
    core = [path for path in sorted(PACKAGE.rglob("*.py"))
            if not path.is_relative_to(lab) and path != COMMAND_LINE]
    # The MQTT transport names netq.lab.brokers.local_broker() in an error message, as text.
    assert len(core) > 30 and PACKAGE / "transports" / "mqtt" / "transport.py" in core
    for path in core:
        found = imports_the_lab(imported_modules(path))
        assert not found, f"{path.relative_to(PACKAGE)} imports {found}"


def test_the_check_sees_an_import_of_the_lab():
    """The checker itself: absolute, relative, lazy and TYPE_CHECKING imports of the lab are
    found, and a module whose name merely starts with "lab" is not mistaken for it."""
    lazy = "def hint():\n    from .lab.brokers import local_broker\n"
    assert imports_the_lab(imports_of(lazy, "netq.display")) == ["netq.lab.brokers",
                                                                 "netq.lab.brokers.local_broker"]
    assert imports_the_lab(imports_of("from . import lab", "netq.engine")) == ["netq.lab"]
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import netq.lab.relay\n"
    assert imports_the_lab(imports_of(guarded, "netq.stream")) == ["netq.lab.relay"]
    deep = "from ...lab import trace"
    assert imports_the_lab(imports_of(deep, "netq.transports.mqtt.transport")) == [
        "netq.lab", "netq.lab.trace"]
    assert imports_the_lab(imports_of("from .laboratory import x", "netq.engine")) == []
    # ...and the command line's own import of the demo is one, exempt by name only.
    assert imports_the_lab(imported_modules(COMMAND_LINE)) == ["netq.lab", "netq.lab.demo"]


# What netq.display may import from netq: itself, the snapshots it shows and the engine's byte
# formatter. Nothing above it (the netq package, the communicator, the engine): the communicator
# imports the display, so an arrow back up would close a circle through netq/__init__.py.
DISPLAY_MAY_IMPORT = ("netq.display", "netq.statistics", "netq.diagnostics")


def test_the_display_imports_nothing_above_it():
    paths = sources("display")
    assert len(paths) >= 7  # the package and its modules are all looked at
    for path in paths:
        # The optional live views (the netq[widgets] extra), which the notebook hooks offer
        # when a notebook asks for one: imported inside the hooks only (see the next check).
        allowed = DISPLAY_MAY_IMPORT + (("netq.widgets",) if path.name == "notebook.py" else ())
        upward = sorted(name for name in imported_modules(path) if not name.startswith(allowed))
        assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}"
    hooks = ast.parse((PACKAGE / "display" / "notebook.py").read_text())
    at_import = {alias.name for node in hooks.body if isinstance(node, ast.Import)
                 for alias in node.names}
    assert "netq.widgets" not in at_import and not [
        node for node in hooks.body
        if isinstance(node, ast.ImportFrom) and "widgets" in (node.module or "")]


# ---------------------------------------------------------------- no import circles
# Every module of netq/ (its subpackages too, whatever they are: netq/lab/ is looked at as
# soon as it exists) imports in one direction only. An import under TYPE_CHECKING and one
# inside a function count: they are part of the design (a type checker and a lazy caller
# follow them), and a circle through one is a knot all the same.


def _graph_module(path: Path, root: Path, top: str) -> tuple[str, bool]:
    """The dotted name of the module at ``path`` (a package: its own name) and whether it is
    a package."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join((top, *parts[:-1])), True
    return ".".join((top, *parts)), False


def module_imports(text: str, module: str, is_package: bool,
                   modules: set[str]) -> dict[str, int]:
    """The modules of ``modules`` that ``module``'s source ``text`` imports, each with the line
    of its first import. ``from pkg import name`` imports ``pkg.name`` when that is a module,
    else ``pkg``; relative imports, imports in functions and under TYPE_CHECKING count."""
    package = module if is_package else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name != module:
            found.setdefault(name, line)

    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            name = node.module or ""
            full = (f"{base}.{name}" if name else base) if node.level else name
            for alias in node.names:
                if f"{full}.{alias.name}" in modules:
                    add(f"{full}.{alias.name}", node.lineno)
                elif full in modules:
                    add(full, node.lineno)
    return dict(sorted(found.items()))


# The live views ship in the same distribution as netq.widgets, from a folder of their own
# (pyproject.toml maps it): part of the package's import graph, read from the checkout.
WIDGETS = Path(__file__).resolve().parents[1] / "widgets"
PACKAGE_ROOTS = ((PACKAGE, "netq"), (WIDGETS, "netq.widgets"))


def package_import_graph(*roots: tuple[Path, str]) -> dict[str, dict[str, str]]:
    """Every module under the ``(folder, dotted name)`` roots (default: netq/ and the widgets)
    -> {module of the package it imports: "file:line"}."""
    files = {_graph_module(path, root, top): (path, root)
             for root, top in roots or PACKAGE_ROOTS for path in sorted(root.rglob("*.py"))}
    modules = {name for name, _ in files}
    graph: dict[str, dict[str, str]] = {}
    for (name, is_package), (path, root) in files.items():
        where = path.relative_to(root.parent)
        graph[name] = {imported: f"{where}:{line}" for imported, line
                       in module_imports(path.read_text(), name, is_package, modules).items()}
    return graph


def import_circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively), each
    sorted, in order of their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return sorted(circles)


def describe_circles(graph: dict[str, dict[str, str]], circles: list[list[str]]) -> str:
    """Each circle: a shortest way round it, then every arrow inside it with where it is."""
    lines = [f"{len(circles)} import circle(s) (imports under TYPE_CHECKING and in functions "
             f"count; cut an arrow: move what it imports down, or name it through a Protocol "
             f"defined below both):"]
    for members in circles:
        inside = set(members)
        first = members[0]
        came_from: dict[str, str] = {}
        frontier = [first]
        while frontier and first not in came_from:
            following = []
            for node in frontier:
                for target in sorted(graph[node]):
                    if target in inside and target not in came_from:
                        came_from[target] = node
                        following.append(target)
            frontier = following
        path = [first]
        node = came_from[first]
        while node != first:
            path.append(node)
            node = came_from[node]
        path.append(first)
        lines.append(f"  {len(members)} modules: {' -> '.join(reversed(path))}")
        for member in members:
            for target, where in graph[member].items():
                if target in inside:
                    lines.append(f"      {member} -> {target}    ({where})")
    return "\n".join(lines)


def test_the_package_imports_form_no_circle():
    graph = package_import_graph()
    # all of netq/, and the widgets
    assert {"netq.engine", "netq.transports.sockets", "netq.widgets.monitor"} <= set(graph)
    circles = import_circles(graph)
    assert not circles, describe_circles(graph, circles)


def test_the_circle_check_finds_a_circle_in_a_small_package(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\n",  # pkg -> pkg.a: no way back
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "b.py": "def lazy():\n    from pkg.sub import d\n",  # pkg.sub.d is a module
        "sub/__init__.py": "",
        "sub/d.py": "from .. import c\nfrom ..c import helper\n",
        "c.py": "from . import a\n",
        "lonely.py": "from .sub.d import name\nimport pkg.c\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    graph = package_import_graph((root, "pkg"))
    assert graph["pkg.b"] == {"pkg.sub.d": "pkg/b.py:2"}  # a name that is a module
    assert set(graph["pkg.sub.d"]) == {"pkg.c"}  # a module, and a name in it
    assert set(graph["pkg.lonely"]) == {"pkg.sub.d", "pkg.c"}
    circles = import_circles(graph)
    assert circles == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]
    told = describe_circles(graph, circles)
    assert "4 modules: pkg.a -> pkg.b -> pkg.sub.d -> pkg.c -> pkg.a" in told
    assert "pkg.a -> pkg.b    (pkg/a.py:3)" in told
    del graph["pkg.c"]["pkg.a"]  # cut one arrow: no circle is left
    assert import_circles(graph) == []


# The most lines a module may have: one that grows past it holds more than one purpose.
MODULE_LINES = 700


def test_every_module_is_under_the_line_limit():
    paths = [path for root, _ in PACKAGE_ROOTS for path in sorted(root.rglob("*.py"))]
    assert len(paths) > 60 and WIDGETS / "dashboard.py" in paths
    too_long = {str(path.relative_to(WIDGETS.parent)): lines for path in paths
                if (lines := len(path.read_text().splitlines())) >= MODULE_LINES}
    assert not too_long, f"modules of {MODULE_LINES} lines or more: {too_long}"
