"""Build a transport stack from a connection URI.

* ``tcp://`` / ``ssl://`` / ``vm://`` leaf -> :class:`DirectTransport` (no reconnect);
* ``failover:(leaves...)?opts`` -> :class:`FailoverTransport`;
* ``static:(X)`` with one service X (``masterslave:(a,b)`` desugars to this) -> a
  failover transport over X's leaves whose reconnect schedule is the discovery
  agent's: one pass over the list, then the static back-off before the next pass
  (exactly what re-adding a ``maxReconnectAttempts=0`` failover does), so a client can
  use the same URI as a bridge. Several static services make no sense for one client
  connection and raise ``UriError``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from amqtransport._backends.base import Backend
from amqtransport._backends.sockets import SocketBackend
from amqtransport.activemq_options import Scope, meaning_of
from amqtransport.errors import UriError
from amqtransport.options import FailoverOptions, StaticOptions
from amqtransport.transports.base import Transport
from amqtransport.transports.discovery import static_failover_schedule
from amqtransport.transports.failover import FailoverTransport, ScheduleFn
from amqtransport.transports.link import ConnectParams, DirectTransport
from amqtransport.transports.probe import tcp_probe
from amqtransport.uri import CompositeUri, LeafUri, UriNode, parse_uri

__all__ = ["FailoverSpec", "build_transport", "failover_spec", "log_ignored_options"]

log = logging.getLogger(__name__)


def _leaves_of_failover(node: CompositeUri, uri: str) -> list[LeafUri]:
    # jms.* on the failover (ActiveMQConnectionFactory's options) reach every link through its leaf
    jms = tuple((name, value) for name, value in node.amq if name.startswith("jms."))
    leaves = []
    for component in node.components:
        if not isinstance(component, LeafUri):
            raise UriError(f"failover: components must be broker URIs (tcp://, ssl://, vm://), got {component}",
                           uri=uri)
        leaves.append(replace(component, amq=component.amq + jms) if jms else component)
    return leaves


_logged_ignored: set[str] = set()


def log_ignored_options(node: UriNode) -> None:
    """Log, once per process and option, each ActiveMQ option of ``node`` that means nothing
    over STOMP, with the reason (activemq_options.py)."""
    nodes: list[UriNode] = [node]
    while nodes:
        current = nodes.pop()
        if isinstance(current, CompositeUri):
            nodes.extend(current.components)
        scope: Scope = "transport" if isinstance(current, LeafUri) else (
            "failover" if current.scheme == "failover" else "static")
        for name, value in current.amq:
            kind, reason = meaning_of("jms" if name.startswith("jms.") else scope, name)
            if kind == "ignored" and name not in _logged_ignored:
                _logged_ignored.add(name)
                log.info("URI option %s=%s is ignored: %s", name, value, reason)


@dataclass(frozen=True)
class FailoverSpec:
    """What a failover driver (thread or asyncio) needs of a URI."""

    leaves: list[LeafUri]
    options: FailoverOptions
    #: the connect schedule (None: ``backoff.failover_schedule``)
    schedule: ScheduleFn | None = None


def failover_spec(uri: str | UriNode) -> FailoverSpec:
    """``failover:(...)`` and ``static:(X)`` as a failover's leaves, options and schedule
    (see the module docstring). A leaf URI is a failover over that one endpoint that
    never reconnects (one connect attempt; a loss fails the connection)."""
    text = uri if isinstance(uri, str) else str(uri)
    node = parse_uri(uri) if isinstance(uri, str) else uri
    log_ignored_options(node)
    if isinstance(node, LeafUri):
        once = FailoverOptions.model_validate({"randomize": False, "maxReconnectAttempts": 0,
                                               "startupMaxReconnectAttempts": 0})
        return FailoverSpec([node], once)
    if node.scheme == "failover":
        assert isinstance(node.options, FailoverOptions)
        return FailoverSpec(_leaves_of_failover(node, text), node.options)
    if node.scheme == "static":
        assert isinstance(node.options, StaticOptions)
        if len(node.components) != 1:
            raise UriError(
                f"static: lists {len(node.components)} services; a client connection talks to one broker "
                "at a time: use failover:(...) or masterslave:(...) (several static services are for "
                "the bridge agent)", uri=text)
        inner = node.components[0]
        if isinstance(inner, LeafUri):
            leaves, fopts = [inner], FailoverOptions.model_validate({"randomize": False})
        else:
            assert isinstance(inner.options, FailoverOptions)
            if inner.scheme != "failover":
                raise UriError(f"static: component must be a broker URI or failover:(...), got {inner}", uri=text)
            leaves, fopts = _leaves_of_failover(inner, text), inner.options
        # the static agent re-adds the service forever (or N times): reconnect is the agent's job
        fopts = fopts.model_copy(update={"max_reconnect_attempts": -1, "startup_max_reconnect_attempts": -1})
        return FailoverSpec(leaves, fopts, static_failover_schedule(node.options))
    raise UriError(f"unsupported URI scheme {node.scheme!r}", uri=text)


def build_transport(
    uri: str | UriNode,
    params: ConnectParams = ConnectParams(),  # noqa: B008 - frozen
    *,
    backend: Backend | None = None,
    sleep: Callable[[float], object] | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> Transport:
    """The (not yet started) transport for ``uri``."""
    node = parse_uri(uri) if isinstance(uri, str) else uri
    # the TCP probe of the back-off (probe.py) only on real sockets
    probe = tcp_probe if backend is None or isinstance(backend, SocketBackend) else None
    backend = backend if backend is not None else SocketBackend()
    if isinstance(node, LeafUri):
        log_ignored_options(node)
        return DirectTransport(node, params, backend=backend, clock=clock)
    spec = failover_spec(uri)
    return FailoverTransport(spec.leaves, spec.options, params, backend=backend, sleep=sleep, clock=clock, rng=rng,
                             schedule=spec.schedule, probe=probe)
