"""The set of proxies a server manages, with Toxiproxy's rules for each API operation.

Each method is one API operation and raises :class:`~chaos.proxy.errors.ApiError`
subclasses with Toxiproxy's messages (``proxy not found``, ``proxy already exists``,
...). Every change is logged at INFO. All methods run on the server's event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chaos.proxy.errors import ApiError, Conflict, NotFound
from chaos.proxy.proxy import Proxy

__all__ = ["ProxyCollection", "ProxyConfig", "DEFAULT_LISTEN"]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:0"


@dataclass(frozen=True)
class ProxyConfig:
    """A proxy as the API describes it when creating or populating."""

    name: str
    upstream: str
    listen: str = DEFAULT_LISTEN
    enabled: bool = True


class ProxyCollection:
    """Proxies by name."""

    def __init__(self) -> None:
        self.proxies: dict[str, Proxy] = {}

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise NotFound("proxy not found")
        return proxy

    async def create(self, config: ProxyConfig) -> Proxy:
        """Add a proxy and (if enabled) bind it; 409 if the name exists, 500 if the bind fails."""
        if config.name in self.proxies:
            raise Conflict("proxy already exists")
        proxy = Proxy(config.name, config.listen, config.upstream)
        if config.enabled:
            await proxy.start()
        if config.name in self.proxies:  # created concurrently while we were binding
            proxy.stop()
            raise Conflict("proxy already exists")
        self.proxies[config.name] = proxy
        log.info(
            "proxy %s created: listen=%s upstream=%s enabled=%s",
            proxy.name,
            proxy.listen,
            proxy.upstream,
            proxy.enabled,
        )
        return proxy

    async def update(
        self,
        name: str,
        *,
        listen: str | None = None,
        upstream: str | None = None,
        enabled: bool | None = None,
    ) -> Proxy:
        """Change listen/upstream (rebinding) and/or enable or disable, as Toxiproxy does."""
        proxy = self.get(name)
        new_listen = proxy.listen if listen is None else listen
        new_upstream = proxy.upstream if upstream is None else upstream
        want_enabled = proxy.enabled if enabled is None else enabled
        if new_listen != proxy.listen or new_upstream != proxy.upstream:
            Proxy(name, new_listen, new_upstream)  # validates both addresses before stopping
            proxy.stop()
            proxy.listen, proxy.upstream = new_listen, new_upstream
            log.info("proxy %s: listen=%s upstream=%s", name, new_listen, new_upstream)
        if want_enabled and not proxy.enabled:
            await proxy.start()
            log.info("proxy %s enabled", name)
        elif not want_enabled and proxy.enabled:
            proxy.stop()
            log.info("proxy %s disabled", name)
        return proxy

    def delete(self, name: str) -> None:
        proxy = self.get(name)
        proxy.stop()
        del self.proxies[name]
        log.info("proxy %s deleted", name)

    async def populate(self, configs: list[ProxyConfig]) -> tuple[list[Proxy], ApiError | None]:
        """Create or replace each proxy; one whose listen and upstream are unchanged is kept.

        Stops at the first failure and returns the proxies done so far with the error.
        """
        done: list[Proxy] = []
        for config in configs:
            existing = self.proxies.get(config.name)
            if existing is not None:
                if existing.listen == config.listen and existing.upstream == config.upstream:
                    done.append(existing)
                    continue
                self.delete(config.name)
            try:
                done.append(await self.create(config))
            except ApiError as exc:
                return done, exc
        return done, None

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        for proxy in list(self.proxies.values()):
            proxy.reset_toxics()
            if not proxy.enabled:
                await proxy.start()
        log.info("reset: all proxies enabled, all toxics removed")

    def close(self) -> None:
        """Stop every proxy (server shutdown)."""
        for proxy in self.proxies.values():
            proxy.stop()
