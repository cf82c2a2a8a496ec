"""The cluster secret: how the two nodes of a replicated pair recognise each other.

Theory of operation
-------------------
Both nodes of a replicated pair are given the same secret (``--cluster-password-file
FILE``, ``--cluster-password``, or the ``[ha]`` keys ``cluster_password_file`` /
``cluster_password``; ``amq broker pair`` and :class:`BrokerPair` generate one per
pair), as Artemis gives a cluster its ``cluster-user``/``cluster-password``. Every
request that changes a node's role or state -- a replication link
(``amq-ha-replica``), a demote request (``amq-ha-demote``), a stand-by request
(``amq-ha-standby``) -- carries one header::

    amq-ha-auth: v1:<unix time>:<nonce>:<hex HMAC-SHA256(secret, canonical request)>

The canonical request is the version, the time, the nonce, the request header's name
and value and every header the receiver acts on (:data:`SIGNED_HEADERS`: the
sender's epoch and its client and HA addresses), one per line. So the secret never
crosses the wire, a captured request cannot be altered (a forged epoch or address
breaks the MAC), and :class:`RequestVerifier` refuses one that is replayed: the time
must be within :data:`MAX_SKEW` seconds of the receiver's clock and the nonce unseen
within that window (the nodes' clocks must agree to within that; NTP does). Status
requests need no secret: they change nothing.

Signing and checking take the clock as a parameter (tests never wait).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from amqtransport.errors import ConfigError

__all__ = [
    "AUTH_HEADER",
    "MAX_SKEW",
    "SIGNED_HEADERS",
    "RequestSigner",
    "RequestVerifier",
    "generate_secret",
    "load_secret",
]

log = logging.getLogger(__name__)

AUTH_HEADER = "amq-ha-auth"
#: headers covered by the MAC besides the request header itself
SIGNED_HEADERS = ("amq-ha-epoch", "amq-ha-client", "amq-ha-port")
#: seconds a signed request stays valid (either way: the nodes' clocks may differ)
MAX_SKEW = 120.0
MIN_SECRET_LENGTH = 16
_VERSION = "v1"
_MAX_NONCES = 100_000


def generate_secret() -> str:
    """A fresh random cluster secret (43 URL-safe characters, 256 bits)."""
    return secrets.token_urlsafe(32)


def load_secret(password: str | None, password_file: str | None) -> bytes:
    """The cluster secret from exactly one of the two sources; :class:`ConfigError`
    naming the option when it is missing, unreadable, empty or too short."""
    if password is not None and password_file is not None:
        raise ConfigError("give --cluster-password or --cluster-password-file, not both", path="cluster_password")
    if password_file is not None:
        path = Path(password_file)
        try:
            text = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode
        except OSError as exc:
            raise ConfigError(
                f"--cluster-password-file {path}: cannot read it: {exc.strerror or exc}", path="cluster_password_file"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            # not fatal (a shared volume may not keep modes), but say it
            log.warning(
                "cluster password file %s is readable by group or others (mode %o): chmod 600 it", path, mode & 0o777
            )
        secret, what = text.strip(), f"--cluster-password-file {path}"
    elif password is not None:
        secret, what = password, "--cluster-password"
    else:
        raise ConfigError(
            "--ha replicated needs the pair's cluster secret: --cluster-password-file FILE (the same file "
            "content on both nodes), --cluster-password, or cluster_password_file / cluster_password in the "
            "[ha] table; `amq broker pair` generates one",
            path="cluster_password",
        )
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"{what}: the cluster secret must have at least {MIN_SECRET_LENGTH} characters, got {len(secret)}",
            path="cluster_password",
        )
    return secret.encode("utf-8")


def _canonical(request: str, headers: Mapping[str, str], stamp: str, nonce: str) -> bytes:
    lines = [_VERSION, stamp, nonce, f"{request}={headers.get(request, '')}"]
    lines += [f"{h}={headers.get(h, '')}" for h in SIGNED_HEADERS]
    return "\n".join(lines).encode("utf-8")


def _mac(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


class RequestSigner:
    """Signs the requests this node sends to its peer."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, request: str, headers: Mapping[str, str], now: float, nonce: str | None = None) -> str:
        """The value of :data:`AUTH_HEADER` for a request whose ``request`` header and
        :data:`SIGNED_HEADERS` are in ``headers``."""
        stamp = str(int(now))
        nonce = nonce if nonce is not None else os.urandom(12).hex()
        return f"{_VERSION}:{stamp}:{nonce}:{_mac(self._secret, _canonical(request, headers, stamp, nonce))}"


class RequestVerifier:
    """Checks the requests this node receives; remembers nonces to refuse replays."""

    def __init__(self, secret: bytes, max_skew: float = MAX_SKEW) -> None:
        self._secret = secret
        self.max_skew = max_skew
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> time it expires

    def check(self, request: str, headers: Mapping[str, str], now: float) -> str | None:
        """None when the request is authentic and fresh, else why it is not."""
        value = headers.get(AUTH_HEADER)
        if not value:
            return "no cluster authentication (amq-ha-auth header missing)"
        parts = value.split(":")
        if len(parts) != 4 or parts[0] != _VERSION:
            return "malformed amq-ha-auth header"
        _v, stamp, nonce, mac = parts
        if not stamp.isdigit() or not 8 <= len(nonce) <= 64 or len(mac) != 64:
            return "malformed amq-ha-auth header"
        expected = _mac(self._secret, _canonical(request, headers, stamp, nonce))
        if not hmac.compare_digest(expected, mac.lower()):
            return "bad cluster secret (the MAC does not match: the nodes have different secrets)"
        skew = now - int(stamp)
        if abs(skew) > self.max_skew:
            return f"request time is {skew:+.0f} s off this node's clock (limit {self.max_skew:.0f} s): a replay, or clocks apart"
        self._forget(now)
        if nonce in self._seen:
            return "replayed request (nonce already used)"
        self._seen[nonce] = now + 2 * self.max_skew
        return None

    def _forget(self, now: float) -> None:
        seen = self._seen
        while seen and (len(seen) >= _MAX_NONCES or next(iter(seen.values())) < now):
            seen.popitem(last=False)
