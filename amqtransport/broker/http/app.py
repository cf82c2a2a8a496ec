"""The side port's routes: probes, metrics, the console pages and the JSON API.

Theory of operation
-------------------
:class:`ConsoleApp` is the one request handler of the :class:`~.h11_server.HttpServer`.
It reads the node only through a :class:`~..view.NodeView` and changes it only
through the view's :class:`~..admin.BrokerAdmin`. In order, each request:

1. is refused (403) when it comes from where it must not (:meth:`Security.cross_origin`);
2. ``/healthz``, ``/readyz``, ``/metrics`` and ``/static/`` answer without a login;
3. the caller is identified (session cookie or Basic credentials); with a users file,
   a page without a user redirects to ``/login`` and an API call gets 401;
4. a POST (every action is one; other methods get 405) needs the CSRF token of that
   identity (403 otherwise), and a node that serves no clients answers 503;
5. the action runs, is logged on the ``amqtransport.broker.http.audit`` logger
   (who, from where, what, the outcome: refusals too), and answers JSON -- or, for a
   plain HTML form post, a 303 back to the page with the outcome as a message.

Paths carry queue names and ids percent-encoded, one segment each.
"""

from __future__ import annotations

import json
import logging
import time
from importlib import resources
from typing import Any
from urllib.parse import quote

from ..ops.admin import AdminError, BrokerAdmin
from ..ops.view import NodeView
from . import api, html_pages
from .h11_server import Request, Response
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import render_metrics
from .security import Identity, Security

__all__ = ["ConsoleApp"]

log = logging.getLogger(__name__)
audit = logging.getLogger("amqtransport.broker.http.audit")

HTML = "text/html; charset=utf-8"
JSON = "application/json"
STATIC = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
PAGE_LIMIT = 50


def _json(status: int, data: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps(data, sort_keys=True, default=str).encode() + b"\n"
    return Response(status, body, JSON, [("cache-control", "no-store"), *(headers or [])])


def _messages(n: int) -> str:
    return f"{n} message" if n == 1 else f"{n} messages"


def _safe_next(value: str, default: str = "/") -> str:
    """A redirect target from a form: a local path only (never //host or a scheme)."""
    if value.startswith("/") and not value.startswith("//") and "\\" not in value and "\n" not in value:
        return value
    return default


class ConsoleApp:
    def __init__(self, view: NodeView, security: Security) -> None:
        self.view = view
        self.security = security
        self._static: dict[str, bytes] = {}

    async def __call__(self, req: Request) -> Response:
        reason = self.security.cross_origin(req)
        if reason is not None:
            audit.warning("refused %s %s from %s: %s", req.method, req.path, req.peer, reason)
            return Response(403, f"forbidden: {reason}\n".encode())
        path = req.path
        if path in ("/healthz", "/livez"):
            return Response(200, b"ok: the event loop answers\n", headers=[("cache-control", "no-store")])
        if path == "/readyz":
            stats = self.view.stats()
            text = f"{'ready' if stats.ready else 'not ready'}: {stats.role}: {stats.ready_reason}\n"
            return Response(200 if stats.ready else 503, text.encode(), headers=[("cache-control", "no-store")])
        if path == "/metrics":
            return Response(200, render_metrics(self.view.stats()).encode(), METRICS_TYPE)
        if path.startswith("/static/"):
            return self._static_file(path[len("/static/"):])
        if path == "/favicon.ico":
            return self._static_file("favicon.svg")
        identity = self.security.identify(req)
        if identity.bad_credentials:
            audit.warning("refused %s %s from %s: bad credentials", req.method, req.path, req.peer)
            return _json(401, {"error": "authentication failed: bad user or password"},
                         [("www-authenticate", 'Basic realm="amq broker"')])
        if path.startswith("/api/") or path == "/api":
            return await self._api(req, identity)
        if req.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=[("allow", "GET, HEAD")])
        return await self._page(req, identity)

    # ------------------------------------------------------------------ helpers
    def _static_file(self, name: str) -> Response:
        if name not in STATIC:
            return Response(404, b"not found\n")
        if name not in self._static:
            self._static[name] = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(200, self._static[name], STATIC[name], [("cache-control", "no-cache")])

    def _page_ctx(self, req: Request, identity: Identity, node: dict[str, Any]) -> tuple[html_pages.Page, list[tuple[str, str]]]:
        """The page frame; an anonymous visitor gets a session (its CSRF token is bound to it)."""
        headers: list[tuple[str, str]] = []
        if identity.via == "anonymous":
            sid = self.security.new_session(None)
            identity = Identity(None, "session", sid)
            headers.append(self.security.set_cookie(sid))
        msg = req.query.get("msg", "")
        page = html_pages.Page(node, user=identity.user, auth_required=self.security.auth_required,
                          csrf=self.security.csrf_token(identity), flash=msg[:300],
                          flash_error=req.query.get("error") == "1")
        return page, headers

    def _html(self, status: int, text: str, headers: list[tuple[str, str]]) -> Response:
        return Response(status, text.encode(), HTML, [("cache-control", "no-store"),
                                                      ("content-security-policy", html_pages.CSP),
                                                      ("x-frame-options", "DENY"),
                                                      ("referrer-policy", "same-origin"), *headers])

    # ------------------------------------------------------------------ pages
    async def _page(self, req: Request, identity: Identity) -> Response:
        segs = req.segments()
        stats = self.view.stats()
        node = api.node_json(stats)
        if segs == ["login"]:
            page, headers = self._page_ctx(req, identity, node)
            return self._html(200, html_pages.login_page(page, _safe_next(req.query.get("next", "/")),
                                                    req.query.get("msg", "") if req.query.get("error") else ""),
                              headers)
        if not self.security.allowed(identity):
            target = "/login?next=" + quote(req.target, safe="")
            return Response(303, b"", HTML, [("location", target)])
        page, headers = self._page_ctx(req, identity, node)
        dests = [api.destination_json(d) for d in stats.destinations]
        if not segs:
            nodes = api.nodes_json(stats, await self.view.peers())
            return self._html(200, html_pages.overview_page(page, nodes, dests), headers)
        if segs == ["destinations"]:
            return self._html(200, html_pages.destinations_page(page, dests, list(stats.replica)), headers)
        if segs == ["connections"]:
            admin = self.view.admin()
            conns = [api.connection_json(c) for c in admin.connections()] if admin is not None else []
            return self._html(200, html_pages.connections_page(page, conns, admin is not None), headers)
        if len(segs) == 2 and segs[0] == "queues":
            found = self._find_queue(stats, segs[1])
            admin = self.view.admin()
            if found is None or admin is None:
                what = (f"No queue {segs[1]!r} on this node." if admin is not None
                        else f"This node serves no clients ({stats.ready_reason}); open the master's console.")
                return self._html(404, html_pages.not_found_page(page, what), headers)
            try:
                offset = max(0, int(req.query.get("offset", "0")))
            except ValueError:
                offset = 0
            try:
                browse = api.browse_json(admin.browse(segs[1], offset=offset, limit=PAGE_LIMIT))
            except AdminError as exc:
                return self._html(exc.status, html_pages.not_found_page(page, str(exc)), headers)
            return self._html(200, html_pages.queue_page(page, found, browse, PAGE_LIMIT), headers)
        return self._html(404, html_pages.not_found_page(page, f"No page {req.path!r}."), headers)

    @staticmethod
    def _find_queue(stats: Any, name: str) -> dict[str, Any] | None:
        for d in stats.destinations:
            if d.kind != "topic" and d.name == name:
                return api.destination_json(d)
        return None

    # ------------------------------------------------------------------ API
    async def _api(self, req: Request, identity: Identity) -> Response:
        segs = req.segments()[1:]
        if segs == ["session"] and req.method in ("GET", "HEAD"):
            return _json(200, {"user": identity.user, "auth_required": self.security.auth_required,
                               "csrf_token": self.security.csrf_token(identity)})
        if segs == ["login"] and req.method == "POST":
            return await self._login(req, identity)
        if not self.security.allowed(identity):
            audit.warning("refused %s %s from %s: not logged in", req.method, req.path, req.peer)
            challenge = [] if req.header("x-requested-with") or identity.via == "session" else [
                ("www-authenticate", 'Basic realm="amq broker"')]
            return _json(401, {"error": "authentication required: log in, or send HTTP Basic credentials"},
                         challenge)
        if req.method in ("GET", "HEAD"):
            return await self._api_read(req, segs)
        if req.method != "POST":
            return _json(405, {"error": f"method {req.method} not allowed"}, [("allow", "GET, POST")])
        return await self._api_action(req, identity, segs)

    async def _api_read(self, req: Request, segs: list[str]) -> Response:
        stats = self.view.stats()
        if segs in (["overview"], []):
            return _json(200, {"node": api.node_json(stats), "nodes": api.nodes_json(stats, await self.view.peers()),
                               "totals": api.totals_json(stats.destinations), "time": time.time()})
        if segs == ["node"]:
            return _json(200, api.node_json(stats))
        if segs == ["nodes"]:
            return _json(200, {"nodes": api.nodes_json(stats, await self.view.peers())})
        if segs == ["destinations"]:
            kind = req.query.get("kind", "")
            needle = req.query.get("filter", "").lower()
            dests = [api.destination_json(d) for d in stats.destinations
                     if (not kind or d.kind == kind) and needle in d.name.lower()]
            return _json(200, {"destinations": dests, "totals": api.totals_json(stats.destinations),
                               "replica": [list(r) for r in stats.replica], "time": time.time()})
        admin = self.view.admin()
        if segs == ["connections"]:
            return _json(200, {"connections": [api.connection_json(c) for c in admin.connections()]
                               if admin is not None else []})
        if segs and segs[0] == "queues" and len(segs) in (2, 3) and segs[2:] in ([], ["messages"]):
            found = self._find_queue(stats, segs[1])
            if found is None:
                return _json(404, {"error": f"no queue {segs[1]!r} on this node"})
            if len(segs) == 2:
                return _json(200, found)
            if admin is None:
                return _json(503, {"error": f"this node serves no clients ({stats.ready_reason})"})
            try:
                offset = int(req.query.get("offset", "0"))
                limit = int(req.query.get("limit", str(PAGE_LIMIT)))
            except ValueError:
                return _json(400, {"error": "offset and limit must be integers"})
            try:
                return _json(200, api.browse_json(admin.browse(segs[1], offset=offset, limit=limit)))
            except AdminError as exc:
                return _json(exc.status, {"error": str(exc)})
        return _json(404, {"error": f"no API endpoint GET {req.path}"})

    async def _login(self, req: Request, identity: Identity) -> Response:
        try:
            form = api.parse_body(req.header("content-type"), req.body)
        except api.BadRequest as exc:
            return _json(400, {"error": str(exc)})
        if not self.security.csrf_ok(identity, form.text("csrf_token") or req.header("x-csrf-token")):
            audit.warning("refused login from %s: missing or wrong CSRF token", req.peer)
            return _json(403, {"error": "missing or wrong CSRF token (reload the login page)"})
        user, password = form.text("user"), form.text("password")
        next_url = _safe_next(form.text("_next"))
        html = not self._wants_json(req)
        if not self.security.check_password(user, password):
            audit.warning("login of user %r from %s refused: bad user or password", user, req.peer)
            if html:
                return Response(303, b"", HTML, [("location", "/login?error=1&msg=" + quote("bad user or password")
                                                  + "&next=" + quote(next_url, safe=""))])
            return _json(401, {"error": "bad user or password"})
        self.security.end_session(identity.sid)
        sid = self.security.new_session(user)
        audit.info("user %r logged in from %s", user, req.peer)
        cookie = self.security.set_cookie(sid)
        if html:
            return Response(303, b"", HTML, [("location", next_url), cookie])
        token = self.security.csrf_token(Identity(user, "session", sid))
        return _json(200, {"ok": True, "user": user, "csrf_token": token}, [cookie])

    @staticmethod
    def _wants_json(req: Request) -> bool:
        return "application/json" in req.header("accept") or bool(req.header("x-requested-with")) or \
            req.header("content-type").startswith("application/json")

    async def _api_action(self, req: Request, identity: Identity, segs: list[str]) -> Response:
        try:
            form = api.parse_body(req.header("content-type"), req.body)
        except api.BadRequest as exc:
            return _json(400, {"error": str(exc)})
        who = f"user {identity.user!r}" if identity.user else "anonymous"
        what = f"{req.method} {req.path}"
        token = req.header("x-csrf-token") or form.text("csrf_token")
        if not self.security.csrf_ok(identity, token):
            audit.warning("refused %s by %s from %s: missing or wrong CSRF token", what, who, req.peer)
            return _json(403, {"error": "missing or wrong CSRF token: send X-CSRF-Token (GET /api/session)"})
        if segs == ["logout"]:
            self.security.end_session(identity.sid)
            audit.info("%s logged out from %s", who, req.peer)
            return self._done(req, form, 200, "logged out", [self.security.clear_cookie()], default_next="/login")
        admin = self.view.admin()
        if admin is None:
            stats = self.view.stats()
            audit.warning("refused %s by %s from %s: node %s is %s", what, who, req.peer, stats.name, stats.role)
            return self._done(req, form, 503, f"node {stats.name} serves no clients ({stats.ready_reason}): "
                                              "act on the master's console")
        try:
            status, message = await self._run(admin, segs, form, who)
        except api.BadRequest as exc:
            status, message = 400, str(exc)
        except AdminError as exc:
            status, message = exc.status, str(exc)
        level = logging.INFO if status < 400 else logging.WARNING
        audit.log(level, "%s by %s from %s: %s (%d)", what, who, req.peer, message, status)
        return self._done(req, form, status, message)

    def _done(self, req: Request, form: api.Form, status: int, message: str,
              headers: list[tuple[str, str]] | None = None, default_next: str = "/") -> Response:
        if self._wants_json(req):
            data = {"ok": True, "message": message} if status < 400 else {"ok": False, "error": message}
            return _json(status, data, headers)
        target = _safe_next(form.text("_next"), default_next)
        sep = "&" if "?" in target else "?"
        flag = "&error=1" if status >= 400 else ""
        return Response(303, b"", HTML, [("location", f"{target}{sep}msg={quote(message)}{flag}"), *(headers or [])])

    async def _run(self, admin: BrokerAdmin, segs: list[str], form: api.Form, who: str) -> tuple[int, str]:
        if segs == ["send"]:
            dest = form.text("destination").strip()
            if not dest:
                raise api.BadRequest("field 'destination' is required")
            body = form.text("body").encode("utf-8")
            await admin.send(dest, body, form.headers(), persistent=form.flag("persistent", True))
            return 200, f"sent {len(body)} bytes to {dest}"
        if len(segs) >= 3 and segs[0] == "queues":
            queue, action = segs[1], segs[2:]
            if action == ["purge"]:
                n = await admin.purge(queue)
                return 200, f"purged {_messages(n)} from {queue}"
            if action in (["move"], ["retry"]):
                ids = form.strings("ids")
                everything = form.flag("all")
                if (ids is None) == (not everything):
                    raise api.BadRequest("give either 'ids' (message ids) or 'all': true")
                to = form.text("to").strip() if action == ["move"] else ""
                if action == ["move"] and not to:
                    raise api.BadRequest("field 'to' (the target queue) is required to move")
                result = await admin.move(queue, None if everything else ids, to or None)
                text = f"moved {_messages(result.moved)} from {queue} to {', '.join(result.targets) or '-'}"
                if result.missing:
                    text += f"; not waiting in {queue}: {', '.join(result.missing)}"
                return (200 if result.moved or not result.missing else 404), text
            if len(action) == 3 and action[0] == "messages" and action[2] == "delete":
                await admin.delete(queue, action[1])
                return 200, f"deleted message {action[1]} from {queue}"
        if len(segs) == 3 and segs[0] == "connections" and segs[2] == "close":
            if admin.close_connection(segs[1], f"connection closed by an administrator ({who})"):
                return 200, f"closed connection {segs[1]}"
            return 404, f"no connection {segs[1]!r}"
        return 404, f"no API action POST /api/{'/'.join(quote(s, safe='') for s in segs)}"
