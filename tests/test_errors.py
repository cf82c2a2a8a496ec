"""Every error amqtransport raises is an AmqTransportError (amqtransport/errors.py).

The test imports every module of the project's packages and walks the exception
classes they define: each must belong to the family, but for the few control-flow
signals below, which never leave the code that raises them. The broker's own errors
(journal, records, checkpoints, the core, replication, the console) sit under
``ServerError``; the HA helpers map ``OSError`` at their boundary.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest

from amqtransport.errors import AmqTransportError, ServerError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("amqtransport", "bridge", "chaos")

#: exceptions used as signals inside one piece of code, never raised to a caller
SIGNALS = {
    "amqtransport.broker.connection.stream.ErrorSent": "stops the handling of a frame once its ERROR is written",
    "amqtransport.broker.ha.node._Stop": "ends a node's role loop on a signal",
    "chaos.proxy.toxics.EndOfStream": "a toxic ends its direction of a proxied connection",
}


def _module_names() -> list[str]:
    names = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def exception_classes(module: ModuleType) -> list[type[BaseException]]:
    return [
        obj
        for _name, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == module.__name__
    ]


def outside_the_family(classes: list[type[BaseException]]) -> list[str]:
    return [
        f"{c.__module__}.{c.__qualname__}"
        for c in classes
        if not issubclass(c, AmqTransportError) and f"{c.__module__}.{c.__qualname__}" not in SIGNALS
    ]


def test_every_exception_class_is_in_the_family() -> None:
    classes: list[type[BaseException]] = []
    for name in _module_names():
        classes.extend(exception_classes(importlib.import_module(name)))
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    assert len(classes) > 40  # the walk sees the whole project
    assert set(SIGNALS) <= names, "a signal listed here no longer exists: remove it from SIGNALS"
    assert outside_the_family(classes) == []


def test_the_walk_can_fail() -> None:
    class Stray(RuntimeError):
        pass

    assert outside_the_family([Stray]) == [f"{__name__}.test_the_walk_can_fail.<locals>.Stray"]


@pytest.mark.parametrize(
    ("path", "also"),
    [
        ("amqtransport.broker.dispatch.errors.CoreError", ()),
        ("amqtransport.broker.store.journal.JournalError", (OSError,)),
        ("amqtransport.broker.store.records.RecordError", (ValueError,)),
        ("amqtransport.broker.ha.wire.ReplicationError", ()),
        ("amqtransport.broker.ops.admin.AdminError", ()),
    ],
)
def test_the_broker_errors_are_server_errors(path: str, also: tuple[type[BaseException], ...]) -> None:
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, ServerError)
    for base in also:  # what existing `except` clauses catch still catches them
        assert issubclass(cls, base)


def test_the_ha_helpers_map_os_errors_at_their_boundary() -> None:
    from amqtransport.broker.ha.wire import NodeUnreachable, ha_request_sync
    from amqtransport.testing.ports import free_port

    port = free_port()  # nothing listens there
    with pytest.raises(NodeUnreachable) as info:
        ha_request_sync("127.0.0.1", port, timeout=1.0)
    assert isinstance(info.value, ServerError)
    assert isinstance(info.value, ConnectionRefusedError)  # callers that tell a refusal apart still can
    assert "refused" in str(info.value).lower()  # the OS's message, unchanged
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
