"""Toxiproxy 2.x's REST API, served by the broker's HTTP/1.1 server
(:mod:`amqtransport.broker.http.h11_server`, h11 under an asyncio ``Protocol``).

Routes, statuses and JSON follow Toxiproxy 2.12 (see ``docs/chaos.md``)::

    GET  /version                          200 {"version": "2.12.0"}
    GET  /proxies                          200 {name: proxy, ...}
    POST /proxies                          201 proxy   (400, 409, 500 if the bind fails)
    POST /populate                         201 {"proxies": [...]}
    POST /reset                            204         (enable all, remove all toxics)
    GET  /proxies/{p}                      200 proxy   (404)
    POST|PATCH /proxies/{p}                200 proxy   (listen, upstream, enabled)
    DELETE /proxies/{p}                    204
    GET  /proxies/{p}/toxics               200 [toxic, ...]
    POST /proxies/{p}/toxics               200 toxic   (400 bad type/stream/attribute, 409)
    GET  /proxies/{p}/toxics/{t}           200 toxic
    POST|PATCH /proxies/{p}/toxics/{t}     200 toxic   (merges attributes, toxicity)
    DELETE /proxies/{p}/toxics/{t}         204

Errors are ``{"error": message, "status": N}`` (:func:`error_response`, also the server's
answer to a malformed request); unknown paths 404, wrong methods 405.
Request bodies are JSON; unknown fields are ignored, wrongly typed ones are a 400.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from amqtransport.broker.http.h11_server import Request, Response
from chaos.proxy.addresses import parse_hostport
from chaos.proxy.collection import DEFAULT_LISTEN, ProxyCollection, ProxyConfig
from chaos.proxy.errors import ApiError, BadRequest

__all__ = ["ToxiproxyApi", "TOXIPROXY_VERSION", "error_response", "json_response"]

log = logging.getLogger(__name__)

TOXIPROXY_VERSION = "2.12.0"

_Route = Callable[[Request, list[str]], Awaitable[Response]]


def json_response(status: int, payload: object) -> Response:
    return Response(status, json.dumps(payload).encode("utf-8") + b"\n", "application/json")


def error_response(status: int, message: str) -> Response:
    """Toxiproxy's error shape: ``{"error": message, "status": status}``."""
    return json_response(status, {"error": message, "status": status})


def _json_body(request: Request) -> Any:
    if not request.body.strip():
        raise BadRequest("bad request body: empty")
    try:
        return json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"bad request body: {exc}") from exc


def _object_body(request: Request) -> dict[str, Any]:
    body = _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("bad request body: expected a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if kind is bool:
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if value is not None and not ok:
        raise BadRequest(f"bad request body: {name!r} must be {what}, got {value!r}")
    return value


def _proxy_config(body: Any, where: str = "") -> ProxyConfig:
    if not isinstance(body, dict):
        raise BadRequest(f"bad request body: expected a JSON object{where}")
    name = _field(body, "name", str, "a string")
    upstream = _field(body, "upstream", str, "a string")
    listen = _field(body, "listen", str, "a string")
    enabled = _field(body, "enabled", bool, "true or false")
    if not name:
        raise BadRequest(f"missing required field: name{where}")
    if not upstream:
        raise BadRequest(f"missing required field: upstream{where}")
    config = ProxyConfig(
        name=name,
        upstream=upstream,
        listen=listen or DEFAULT_LISTEN,
        enabled=True if enabled is None else enabled,
    )
    parse_hostport(config.listen, "listen")
    parse_hostport(config.upstream, "upstream")
    return config


class ToxiproxyApi:
    """The request handler: ``await api(request) -> response``."""

    def __init__(self, collection: ProxyCollection) -> None:
        self.collection = collection
        # (number of path segments, first segment, third segment) -> {method: route}
        self._routes: dict[tuple[int, str, str], dict[str, _Route]] = {
            (1, "version", ""): {"GET": self._version},
            (1, "proxies", ""): {"GET": self._list_proxies, "POST": self._create_proxy},
            (1, "populate", ""): {"POST": self._populate},
            (1, "reset", ""): {"POST": self._reset},
            (2, "proxies", ""): {
                "GET": self._get_proxy,
                "POST": self._update_proxy,
                "PATCH": self._update_proxy,
                "DELETE": self._delete_proxy,
            },
            (3, "proxies", "toxics"): {"GET": self._list_toxics, "POST": self._create_toxic},
            (4, "proxies", "toxics"): {
                "GET": self._get_toxic,
                "POST": self._update_toxic,
                "PATCH": self._update_toxic,
                "DELETE": self._delete_toxic,
            },
        }

    async def __call__(self, request: Request) -> Response:
        segments = [s for s in request.segments() if s]
        key = (
            len(segments),
            segments[0] if segments else "",
            segments[2] if len(segments) >= 3 else "",
        )
        methods = self._routes.get(key)
        if methods is None:
            return error_response(404, "not found")
        route = methods.get(request.method)
        if route is None:
            allow = ", ".join(sorted(methods))
            response = error_response(
                405, f"method {request.method} not allowed (allowed: {allow})"
            )
            response.headers.append(("Allow", allow))
            return response
        try:
            return await route(request, segments)
        except ApiError as exc:
            if exc.status >= 500:
                log.warning("%s %s: %s", request.method, request.target, exc.message)
            return error_response(exc.status, exc.message)

    # -- server --------------------------------------------------------------------------
    async def _version(self, request: Request, segments: list[str]) -> Response:
        return json_response(200, {"version": TOXIPROXY_VERSION})

    async def _reset(self, request: Request, segments: list[str]) -> Response:
        await self.collection.reset()
        return Response(204)

    # -- proxies ---------------------------------------------------------------------------
    async def _list_proxies(self, request: Request, segments: list[str]) -> Response:
        return json_response(
            200, {name: p.to_json() for name, p in self.collection.proxies.items()}
        )

    async def _create_proxy(self, request: Request, segments: list[str]) -> Response:
        proxy = await self.collection.create(_proxy_config(_json_body(request)))
        return json_response(201, proxy.to_json())

    async def _populate(self, request: Request, segments: list[str]) -> Response:
        body = _json_body(request)
        if not isinstance(body, list):
            raise BadRequest("bad request body: expected a JSON array of proxies")
        configs = [_proxy_config(item, f" at proxy {i + 1}") for i, item in enumerate(body)]
        proxies, error = await self.collection.populate(configs)
        payload: dict[str, Any] = {"proxies": [p.to_json() for p in proxies]}
        if error is not None:
            payload.update(error=error.message, status=error.status)
            return json_response(error.status, payload)
        return json_response(201, payload)

    async def _get_proxy(self, request: Request, segments: list[str]) -> Response:
        return json_response(200, self.collection.get(segments[1]).to_json())

    async def _update_proxy(self, request: Request, segments: list[str]) -> Response:
        self.collection.get(segments[1])  # 404 before 400, as Toxiproxy
        body = _object_body(request)
        proxy = await self.collection.update(
            segments[1],
            listen=_field(body, "listen", str, "a string"),
            upstream=_field(body, "upstream", str, "a string"),
            enabled=_field(body, "enabled", bool, "true or false"),
        )
        return json_response(200, proxy.to_json())

    async def _delete_proxy(self, request: Request, segments: list[str]) -> Response:
        self.collection.delete(segments[1])
        return Response(204)

    # -- toxics ----------------------------------------------------------------------------
    async def _list_toxics(self, request: Request, segments: list[str]) -> Response:
        return json_response(200, self.collection.get(segments[1]).to_json()["toxics"])

    async def _create_toxic(self, request: Request, segments: list[str]) -> Response:
        proxy = self.collection.get(segments[1])
        body = _object_body(request)
        type_name = _field(body, "type", str, "a string")
        if not type_name:
            raise BadRequest("invalid toxic type: missing 'type'")
        toxicity = body.get("toxicity")
        spec = proxy.add_toxic(
            type_name,
            name=_field(body, "name", str, "a string"),
            stream=_field(body, "stream", str, "a string") or "downstream",
            toxicity=1.0 if toxicity is None else toxicity,
            attributes=body.get("attributes"),
        )
        return json_response(200, spec.to_json())

    async def _get_toxic(self, request: Request, segments: list[str]) -> Response:
        proxy = self.collection.get(segments[1])
        return json_response(200, proxy.get_toxic(segments[3]).to_json())

    async def _update_toxic(self, request: Request, segments: list[str]) -> Response:
        proxy = self.collection.get(segments[1])
        proxy.get_toxic(segments[3])
        body = _object_body(request)
        spec = proxy.update_toxic(
            segments[3], attributes=body.get("attributes"), toxicity=body.get("toxicity")
        )
        return json_response(200, spec.to_json())

    async def _delete_toxic(self, request: Request, segments: list[str]) -> Response:
        self.collection.get(segments[1]).remove_toxic(segments[3])
        return Response(204)
