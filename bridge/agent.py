"""The bridge agent: a config file's network connectors plus the status endpoint.

``BridgeAgent(config).start()`` builds one :class:`~bridge.connector.NetworkConnector`
per ``[[network_connector]]`` (each with its own discovery agent and local broker: its
own ``local_uri`` or the file's) and serves
``/status`` and ``/metrics`` on ``status_listen``; ``stop()`` stops everything;
``run_forever()`` is what ``amq bridge run`` calls (returns on SIGINT/SIGTERM).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from amqtransport.broker.tracing import SendTracer

from .config import BridgeConfig, leaf_addresses
from .connector import ConnectFn, NetworkConnector, _default_agent_factory
from .forwarder import NodeId
from .network_bridge import _default_connect
from .status import StatusRegistry, StatusServer

__all__ = ["BridgeAgent"]

log = logging.getLogger(__name__)


class BridgeAgent:
    def __init__(
        self,
        config: BridgeConfig,
        *,
        connect: ConnectFn = _default_connect,
        agent_factory: Callable[[Sequence[str], Any, Any], Any] = _default_agent_factory,
    ) -> None:
        self.config = config
        self.registry = StatusRegistry()
        #: the forward spans' exporter (``otel_endpoint``; None: off)
        self.tracer: SendTracer | None = None
        if config.otel_endpoint:
            self.tracer = SendTracer(config.otel_endpoint, name="bridge", service="amq-bridge")
        self.connectors = [
            NetworkConnector(nc, local_uri=config.local_of(nc), registry=self.registry, connect=connect,
                             tracer=self.tracer,
                             here=NodeId.of(config.local_name_of(nc), leaf_addresses(config.local_of(nc))),
                             agent_factory=agent_factory)
            for nc in config.network_connector
        ]
        self.server: StatusServer | None = None
        self._stopped = threading.Event()

    @property
    def status_url(self) -> str | None:
        return None if self.server is None else self.server.url

    def start(self) -> BridgeAgent:
        addr = self.config.status_address
        if addr is not None:
            self.server = StatusServer(self.registry, addr[0], addr[1]).start()
            log.info("bridge status on %s/status and %s/metrics", self.server.url, self.server.url)
        for c in self.connectors:
            log.info("network connector %s: %s -> %s (services: %s)", c.config.name, c.local_uri,
                     c.config.uri, ", ".join(c.services))
            c.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        for c in self.connectors:
            c.stop()
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.tracer is not None:
            self.tracer.close()

    def __enter__(self) -> BridgeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_forever(self) -> None:
        """Start, block until SIGINT/SIGTERM (or :meth:`stop` from another thread), stop."""
        wake = threading.Event()

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping bridges", signum)
            wake.set()

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            while not wake.is_set() and not self._stopped.is_set():
                wake.wait(0.5)
        finally:
            self.stop()
            for s, h in old.items():
                signal.signal(s, h)
            log.info("bridge agent stopped")
