"""The broker's HTTP side port: ``/metrics``, ``/healthz``, ``/readyz``, the web console
and its JSON API (``docs/metrics.md``, ``docs/console.md``).

:func:`start_side_port` binds it on the running loop (the broker's own) for a
:class:`~..view.NodeView`; ``amq broker run --http HOST:PORT`` (or the config file's
``http`` key) calls it for a plain broker and for each node of a pair.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..config import parse_http_address
from ..ops.view import NodeView
from .app import ConsoleApp
from .h11_server import HttpLimits, HttpServer
from .security import Security

__all__ = ["HttpServer", "start_side_port"]

log = logging.getLogger(__name__)


async def start_side_port(
    view: NodeView,
    address: str,
    users: Mapping[str, str] | None = None,
    limits: HttpLimits | None = None,
) -> HttpServer:
    """Bind the side port at ``address`` (``HOST:PORT`` or ``PORT``); OSError when it cannot."""
    host, port = parse_http_address(address)
    security = Security(users, bound_host=host)
    server = HttpServer(ConsoleApp(view, security), host, port, limits)
    await server.start()
    security.set_port(server.port)
    view.http_address = server.address
    log.info("http side port on %s (console /, /metrics, /healthz, /readyz)%s", server.url,
             "; logins from the users file" if security.auth_required else "")
    return server
