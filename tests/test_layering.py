"""Imports flow downward only (docs/architecture.md, "Layers").

Every project module is read with ``ast`` (imports inside functions included) and
each project import is checked against the layer table below: a module may import
modules of its own layer or lower, never higher. The sans-IO codec and the pure
modules must not import I/O, threads, asyncio or the clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (prefix, layer). The longest matching prefix decides a module's layer.
LAYERS: list[tuple[str, int]] = [
    ("amqtransport.errors", 0),
    ("amqtransport.stomp", 1),
    ("amqtransport.uri", 2),
    ("amqtransport.activemq_options", 2),  # ActiveMQ 5.17's client options: what each became or why ignored
    ("amqtransport.options", 2),
    ("amqtransport.backoff", 2),
    ("amqtransport.destinations", 2),  # the destination grammar (broker and bridge)
    ("amqtransport.selector", 2),  # JMS message selectors: ActiveMQ's grammar and evaluation (broker)
    ("amqtransport.loop_thread", 3),  # an asyncio service on a daemon thread (embedded broker, chaos proxy)
    ("amqtransport._loop_thread", 3),  # its old name, an alias kept for code written before the rename
    ("amqtransport.tasks", 3),  # ending asyncio tasks for sure (a cancel that 3.11's wait_for swallowed)
    ("amqtransport.broker", 3),  # the root: config, the server that wires the parts, the embedded broker
    ("amqtransport.broker.dispatch", 3),  # where an accepted message goes (no I/O of its own; see PARTS)
    ("amqtransport.broker.connection", 3),  # one client connection: stream, flow control, frame handlers
    ("amqtransport.broker.ops", 3),  # the operator's side: view, admin actions, histograms
    ("amqtransport._backends", 4),
    ("amqtransport.transports", 5),
    ("amqtransport.client", 6),
    ("amqtransport.aio", 6),  # the asyncio client API over the asyncio failover driver (the client's one source)
    ("amqtransport._sync", 6),  # the sync client's classes, generated from aio/connection.py and aio/requests.py, and its seams
    ("amqtransport.outbound", 6),  # frames both clients build
    ("amqtransport.received", 6),  # the duplicate filter and ack rules both clients apply
    ("amqtransport.connection_info", 6),  # the status both clients' connections show
    ("amqtransport.wire_tap", 6),  # the wire tap both clients' connections offer
    ("amqtransport", 6),  # the package __init__ (lazy re-exports of the public API)
    ("amqtransport.spark", 7),
    ("amqtransport.otel", 7),  # OpenTelemetry instrumentation of both clients (wraps them from outside)
    ("amqtransport.processes", 7),  # brokers as child processes (ours, Debian's ActiveMQ) and the tmpfs of full-disk faults
    ("amqtransport.testing", 7),  # test harnesses (RabbitMQ, Spark clusters, fixtures, wait_for) for tests and benchmarks
    ("bridge", 7),
    ("chaos", 8),
    ("amqtransport.cli", 9),
    ("amqtransport.__main__", 9),
]

PURE = (
    "amqtransport.errors",
    "amqtransport.stomp",
    "amqtransport.uri",
    "amqtransport.activemq_options",
    "amqtransport.options",
    "amqtransport.backoff",
    "amqtransport.destinations",
    "amqtransport.selector",
    "amqtransport.broker.ha.decide",  # the HA decision table: pure, though its layer is the broker's
    "amqtransport.broker.ha.lease",  # the witness's lease rules: pure (the clock is a parameter)
    "amqtransport.broker.dispatch",  # the broker's dispatch core: the server injects both clocks
    "amqtransport.broker.connection.delivery",  # a connection's MESSAGE frames: bytes in, bytes out
    "amqtransport.broker.connection.subscribe",  # what a SUBSCRIBE asks for, from its headers
    # the failover core and its pure pieces: one set of rules for the thread and asyncio drivers
    "amqtransport.transports.core",
    "amqtransport.transports.core_actions",
    "amqtransport.transports.core_state",
    "amqtransport.transports.reconnect",
    "amqtransport.transports.replay",
    "amqtransport.transports.waiting",
)
FORBIDDEN_IN_PURE = {"socket", "ssl", "threading", "asyncio", "time", "select", "selectors", "concurrent", "subprocess", "multiprocessing"}

PACKAGES = ("amqtransport", "bridge", "chaos")


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > best[0]:
                best = (len(prefix), layer)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> list[Path]:
    files: list[Path] = []
    for pkg in PACKAGES:
        files.extend(sorted((ROOT / pkg).rglob("*.py")))
    return files


def imports_of(path: Path, me: str | None = None) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = me or module_name(path)
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                if not is_pkg:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, node.lineno))
            # `from amqtransport import client` imports the submodule too
            for alias in node.names:
                out.append((f"{target}.{alias.name}", node.lineno))
    return out


def test_every_project_module_has_a_layer() -> None:
    missing = [module_name(p) for p in project_modules() if layer_of(module_name(p)) is None]
    assert missing == []


@pytest.mark.parametrize("path", project_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_downward(path: Path) -> None:
    me = module_name(path)
    my_layer = layer_of(me)
    assert my_layer is not None
    bad = []
    for target, line in imports_of(path):
        top = target.split(".")[0]
        if top not in PACKAGES:
            continue
        their_layer = layer_of(target)
        if their_layer is None:
            continue
        if their_layer > my_layer:
            bad.append(f"line {line}: {me} (layer {my_layer}) imports {target} (layer {their_layer})")
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize(
    "path",
    [p for p in project_modules() if module_name(p).startswith(PURE)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_pure_layers_do_no_io(path: Path) -> None:
    bad = [
        f"line {line}: imports {target}"
        for target, line in imports_of(path)
        if target.split(".")[0] in FORBIDDEN_IN_PURE
    ]
    assert bad == [], f"{module_name(path)} must stay sans-IO:\n" + "\n".join(bad)


#: Inside one layer: the parts a part must not import. In the broker, the dispatch core
#: sees neither its connections nor the operator's side nor the server that wires it;
#: a connection sees the core through ``BrokerContext``, never the server or the ops.
#: In chaos, the proxy knows nothing of what uses it, and the harness (clusters behind
#: proxies, client settings) nothing of the scenarios and the nemesis built on it.
PARTS: dict[str, tuple[str, ...]] = {
    "amqtransport.broker.dispatch": (
        "amqtransport.broker.connection",
        "amqtransport.broker.ops",
        "amqtransport.broker.http",
        "amqtransport.broker.ha",
        "amqtransport.broker.server",
        "amqtransport.broker.embedded",
    ),
    "amqtransport.broker.connection": (
        "amqtransport.broker.ops",
        "amqtransport.broker.http",
        "amqtransport.broker.ha",
        "amqtransport.broker.server",
        "amqtransport.broker.embedded",
    ),
    "chaos.proxy": ("chaos.harness", "chaos.scenarios", "chaos.nemesis"),
    "chaos.harness": ("chaos.scenarios", "chaos.nemesis"),
}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_parts_import_downward(part: str) -> None:
    forbidden = PARTS[part]
    bad = [
        f"{module_name(p)} line {line}: imports {target}"
        for p in project_modules()
        if module_name(p) == part or module_name(p).startswith(part + ".")
        for target, line in imports_of(p)
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    ]
    assert bad == []


def test_layer_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself must be able to fail."""
    fake = tmp_path / "probe.py"
    fake.write_text("import socket\nfrom ..client import connect\n")
    found = imports_of(fake, me="amqtransport.stomp.probe")
    upward = [t for t, _ in found if (layer_of(t) or 0) > 1]
    io = [t for t, _ in found if t in FORBIDDEN_IN_PURE]
    assert "amqtransport.client" in upward and io == ["socket"]


def test_the_product_imports_no_test_harness() -> None:
    """``amqtransport/testing/`` holds test harnesses only: the command line (``amq broker
    pair``, ``amq demo``, ``amq chaos``), the broker, the process supervisors, the bridge
    and chaos never import it."""
    shipped = ("amqtransport.cli", "amqtransport.broker", "amqtransport.processes", "bridge", "chaos")
    product = [p for p in project_modules() if module_name(p).startswith(shipped)]
    bad = [
        f"{module_name(p)} line {line}: imports {target}"
        for p in product
        for target, line in imports_of(p)
        if target == "amqtransport.testing" or target.startswith("amqtransport.testing.")
    ]
    assert bad == []


# -- import cycles -----------------------------------------------------------------------
#: cycles left to their owners' work in progress (each must go: a context object or a
#: Protocol breaks it, as broker/connection/context.py does for the connection and the server)
KNOWN_CYCLES: set[frozenset[str]] = set()


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports: at module level, under ``TYPE_CHECKING``
    and inside functions alike. ``from pkg import sub`` is an edge to ``pkg.sub`` only
    (the package is being imported already when one of its modules runs)."""
    paths = {module_name(p): p for p in project_modules()}
    graph: dict[str, set[str]] = {}
    for me, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = me.split(".") if is_pkg else me.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{alias.name}" for alias in node.names]
                if all(s in paths for s in subs):
                    deps.update(subs)
                else:
                    deps.add(target)
                    deps.update(s for s in subs if s in paths)
        graph[me] = {d for d in deps if d in paths and d != me}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    """No module imports, even only for type checking, a module that imports it back
    (directly or around a loop)."""
    found = cycles(import_graph())
    assert [sorted(c) for c in found if c not in KNOWN_CYCLES] == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []
