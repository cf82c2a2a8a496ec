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

import random
import time
from collections.abc import Callable

from amqtransport._backends.base import Backend
from amqtransport._backends.sockets import SocketBackend
from amqtransport.errors import UriError
from amqtransport.options import FailoverOptions, StaticOptions
from amqtransport.transports.base import Transport
from amqtransport.transports.discovery import static_failover_schedule
from amqtransport.transports.failover import FailoverTransport
from amqtransport.transports.probe import tcp_probe
from amqtransport.transports.stomp import ConnectParams, DirectTransport
from amqtransport.uri import CompositeUri, LeafUri, UriNode, parse_uri

__all__ = ["build_transport"]


def _leaves_of_failover(node: CompositeUri, uri: str) -> list[LeafUri]:
    leaves = []
    for component in node.components:
        if not isinstance(component, LeafUri):
            raise UriError(f"failover: components must be broker URIs (tcp://, ssl://, vm://), got {component}",
                           uri=uri)
        leaves.append(component)
    return leaves


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
    text = uri if isinstance(uri, str) else str(uri)
    node = parse_uri(uri) if isinstance(uri, str) else uri
    # the TCP probe of the back-off (probe.py) only on real sockets
    probe = tcp_probe if backend is None or isinstance(backend, SocketBackend) else None
    backend = backend if backend is not None else SocketBackend()
    if isinstance(node, LeafUri):
        return DirectTransport(node, params, backend=backend, clock=clock)
    if node.scheme == "failover":
        assert isinstance(node.options, FailoverOptions)
        return FailoverTransport(_leaves_of_failover(node, text), node.options, params, backend=backend,
                                 sleep=sleep, clock=clock, rng=rng, probe=probe)
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
        return FailoverTransport(leaves, fopts, params, backend=backend, sleep=sleep, clock=clock, rng=rng,
                                 schedule=static_failover_schedule(node.options), probe=probe)
    raise UriError(f"unsupported URI scheme {node.scheme!r}", uri=text)
