"""Who is asking, and may they: logins, sessions, CSRF tokens, Origin and Host checks.

Theory of operation
-------------------
Authentication uses the broker's users file (``--users``), the same one STOMP
logins are checked against. With no users file everybody is let in (the side port
binds 127.0.0.1 unless told otherwise); with one, every page and ``/api/`` call
needs a user (``/metrics``, ``/healthz``, ``/readyz`` and the login page excepted).
A person logs in on ``/login`` and gets a session cookie (``HttpOnly``,
``SameSite=Strict``, named after the port: browsers share cookies between ports of
one host); a script sends HTTP Basic credentials with each request.

CSRF. A browser sends cookies (and remembered Basic credentials) with requests
another site makes it send, so every state-changing request is a POST that must
carry a token the other site cannot read: ``X-CSRF-Token`` (or a ``csrf_token`` form
field) equal to an HMAC, under a per-process secret, of the identity it acts as --
the session id for a cookie, the user for Basic credentials, ``anonymous`` for
neither. Pages embed it; scripts read it from ``GET /api/session``. A POST whose
``Origin`` names another host:port is refused as well, and, while the port is bound
to a loopback address, so is any request whose ``Host`` is not a loopback name
(which defeats DNS rebinding). Sessions live in memory: a restart, or a failover to
the other node, asks for a new login.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..config import check_login
from .h11_server import Request

__all__ = ["Identity", "Security", "SESSION_SECONDS"]

SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 1000
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Identity:
    user: str | None  # None: nobody logged in
    via: str  # session | basic | anonymous
    sid: str | None = None
    bad_credentials: bool = False  # Basic credentials were given and are wrong


@dataclass
class _Session:
    user: str | None
    expires: float


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_only(value: str) -> str:
    """``host:port`` / ``[v6]:port`` / ``host`` -> host (lower case, no brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Security:
    def __init__(
        self,
        users: Mapping[str, str] | None,
        *,
        bound_host: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.users = dict(users or {})
        self.loopback_only = _is_loopback(bound_host)
        self.clock = clock
        self.cookie_name = "amq_session"
        self._secret = secrets.token_bytes(32)
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def set_port(self, port: int) -> None:
        self.cookie_name = f"amq_session_{port}"

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    # ------------------------------------------------------------------ identity
    def _cookie(self, request: Request) -> str | None:
        for part in request.header("cookie").split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name == self.cookie_name:
                return value
        return None

    def identify(self, request: Request) -> Identity:
        auth = request.header("authorization")
        if auth[:6].lower() == "basic ":
            user, password = _basic(auth[6:])
            if user is not None and self.check_password(user, password or ""):
                return Identity(user, "basic")
            return Identity(None, "basic", bad_credentials=True)
        sid = self._cookie(request)
        if sid is not None:
            session = self._sessions.get(sid)
            if session is not None and session.expires > self.clock():
                return Identity(session.user, "session", sid)
        return Identity(None, "anonymous")

    def check_password(self, user: str, password: str) -> bool:
        return check_login(self.users, user, password)

    def allowed(self, identity: Identity) -> bool:
        """May this identity see the console and act (users configured: a user is needed)?"""
        return identity.user is not None or not self.auth_required

    # ------------------------------------------------------------------ sessions
    def new_session(self, user: str | None) -> str:
        now = self.clock()
        while self._sessions and (len(self._sessions) >= MAX_SESSIONS or
                                  next(iter(self._sessions.values())).expires <= now):
            self._sessions.popitem(last=False)
        sid = secrets.token_urlsafe(24)
        self._sessions[sid] = _Session(user, now + SESSION_SECONDS)
        return sid

    def end_session(self, sid: str | None) -> None:
        if sid is not None:
            self._sessions.pop(sid, None)

    def set_cookie(self, sid: str) -> tuple[str, str]:
        return ("set-cookie", f"{self.cookie_name}={sid}; Path=/; HttpOnly; SameSite=Strict; "
                              f"Max-Age={int(SESSION_SECONDS)}")

    def clear_cookie(self) -> tuple[str, str]:
        return ("set-cookie", f"{self.cookie_name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")

    # ------------------------------------------------------------------ CSRF
    def csrf_token(self, identity: Identity) -> str:
        subject = {"session": f"session:{identity.sid}", "basic": f"basic:{identity.user}"}.get(
            identity.via, "anonymous")
        return hmac.new(self._secret, subject.encode(), hashlib.sha256).hexdigest()[:40]

    def csrf_ok(self, identity: Identity, token: str) -> bool:
        return bool(token) and hmac.compare_digest(token, self.csrf_token(identity))

    def cross_origin(self, request: Request) -> str | None:
        """Why a request must be refused for where it comes from (None: it may go on)."""
        host = request.header("host")
        if self.loopback_only and host and not _is_loopback(_host_only(host)):
            return f"Host {host!r} is not a loopback name (this port is bound to a loopback address)"
        origin = request.header("origin")
        if origin and request.method not in ("GET", "HEAD"):
            netloc = urlsplit(origin).netloc.lower()
            if origin == "null" or netloc != host.lower():
                return f"cross-origin request from {origin!r} refused"
        return None


def _basic(encoded: str) -> tuple[str | None, str | None]:
    try:
        text = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None, None
    user, sep, password = text.partition(":")
    return (user, password) if sep else (None, None)
