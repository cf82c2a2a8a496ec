"""The cluster secret: how the two nodes of a replicated pair recognise each other.

Theory of operation
-------------------
Both nodes of a replicated pair are given the same secret (``--cluster-password-file
FILE``, ``--cluster-password``, or the ``[ha]`` keys ``cluster_password_file`` /
``cluster_password``; ``amq broker pair`` and :class:`BrokerPair` generate one per
pair), as Artemis gives a cluster its ``cluster-user``/``cluster-password``. Every
request that changes a node's role or state -- a replication link
(``amq-ha-replica``), a demote request (``amq-ha-demote``), a stand-by request
(``amq-ha-standby``), an operator's release (``amq-ha-release``) -- carries one header::

    amq-ha-auth: v2:<challenge>:<nonce>:<hex HMAC-SHA256(secret, canonical request)>

Freshness comes from the receiver, not from a clock. The requester first asks the
receiver's HA port for its status; the answer carries ``amq-ha-challenge``, a random
value the receiver's :class:`RequestVerifier` issued and remembers for
:data:`CHALLENGE_TTL` seconds of its own monotonic clock. The signed request names
that challenge, and the verifier accepts it once: a challenge it never issued, one
already used or one too old is refused. So a captured request cannot be replayed
(its challenge is spent) or held back and played later (its challenge expires), and
the nodes' wall clocks may disagree by any amount, or jump, at no cost: nothing
compares them. (The first version signed the sender's wall-clock time and refused
a request more than 120 s off the receiver's clock; a clock step on one node then
stopped every signed request between the two.)

The canonical request is the version, the challenge, the nonce, the request header's
name and value and every header the receiver acts on (:data:`SIGNED_HEADERS`: the
sender's epoch and its client and HA addresses), one per line. So the secret never
crosses the wire and a captured request cannot be altered (a forged epoch or address
breaks the MAC). Status requests need no secret: they change nothing.

:class:`HaRequest` is a request waiting for its challenge: the transport
(:func:`.wire.ha_request`) fetches one from the receiver and signs just before it
sends. Checking takes the monotonic time as a parameter (tests never wait).

One request travels the other way on a connection already open: a master's handover
(``amq-ha-handover``) on the replication link its slave opened. The slave issued a
challenge for it (:func:`new_challenge`) in its replication ``CONNECT`` and keeps it
with the link, not in its verifier: the handover answers that challenge or none
(:meth:`RequestVerifier.check` with ``challenge=``), so it is good on that link alone,
however long the link has lived, and the same MAC rule checks it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from amqtransport.errors import ConfigError

__all__ = [
    "AUTH_HEADER",
    "CHALLENGE_HEADER",
    "CHALLENGE_TTL",
    "SIGNED_HEADERS",
    "HaRequest",
    "RequestSigner",
    "RequestVerifier",
    "generate_secret",
    "load_secret",
    "new_challenge",
]

log = logging.getLogger(__name__)

AUTH_HEADER = "amq-ha-auth"
#: headers covered by the MAC besides the request header itself
SIGNED_HEADERS = ("amq-ha-epoch", "amq-ha-client", "amq-ha-port")
#: the status answer's header that carries a fresh challenge
CHALLENGE_HEADER = "amq-ha-challenge"
#: seconds (of the receiver's monotonic clock) a challenge may be answered
CHALLENGE_TTL = 30.0
MIN_SECRET_LENGTH = 16
_VERSION = "v2"
#: challenges remembered at once; the oldest is forgotten first
_MAX_CHALLENGES = 10_000


def new_challenge() -> str:
    """A fresh random challenge (32 hex digits)."""
    return secrets.token_hex(16)


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
            "--ha replicated (and a pair with --witness) needs the pair's cluster secret: --cluster-password-file FILE (the same file "
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


def _canonical(request: str, headers: Mapping[str, str], challenge: str, nonce: str,
               signed: Sequence[str] = SIGNED_HEADERS) -> bytes:
    lines = [_VERSION, challenge, nonce, f"{request}={headers.get(request, '')}"]
    lines += [f"{h}={headers.get(h, '')}" for h in signed]
    return "\n".join(lines).encode("utf-8")


def _mac(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


class RequestSigner:
    """Signs the requests this node (or an operator's command) sends to a node."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, request: str, headers: Mapping[str, str], challenge: str, nonce: str | None = None,
             signed: Sequence[str] = SIGNED_HEADERS) -> str:
        """The value of :data:`AUTH_HEADER` for a request whose ``request`` header and
        ``signed`` headers (:data:`SIGNED_HEADERS`; a witness request signs more) are in
        ``headers``, answering the receiver's ``challenge``."""
        nonce = nonce if nonce is not None else os.urandom(12).hex()
        mac = _mac(self._secret, _canonical(request, headers, challenge, nonce, signed))
        return f"{_VERSION}:{challenge}:{nonce}:{mac}"


@dataclass(frozen=True)
class HaRequest:
    """A role-changing request before its signature: ``request`` is its header's name,
    ``headers`` everything it carries but :data:`AUTH_HEADER`. With a ``signer``, the
    transport signs it against the receiver's challenge (:meth:`signed`); without one
    (a node with no cluster secret) it goes unsigned and the receiver says why it refuses."""

    request: str
    headers: Mapping[str, str]
    signer: RequestSigner | None = None

    def signed(self, challenge: str | None) -> dict[str, str]:
        """The headers to send, signed against ``challenge`` (unsigned when there is no
        signer or the receiver offered no challenge)."""
        out = dict(self.headers)
        if self.signer is not None and challenge:
            out[AUTH_HEADER] = self.signer.sign(self.request, self.headers, challenge)
        return out


class RequestVerifier:
    """Issues challenges and checks the signed requests that answer them."""

    def __init__(self, secret: bytes, ttl: float = CHALLENGE_TTL, max_challenges: int = _MAX_CHALLENGES) -> None:
        self._secret = secret
        self.ttl = ttl
        self._max = max_challenges
        self._issued: OrderedDict[str, float] = OrderedDict()  # challenge -> monotonic time it expires

    def challenge(self, now: float) -> str:
        """A fresh challenge for a status answer (``now``: this node's monotonic clock)."""
        self._forget(now)
        value = new_challenge()
        self._issued[value] = now + self.ttl
        while len(self._issued) > self._max:
            self._issued.popitem(last=False)
        return value

    def check(self, request: str, headers: Mapping[str, str], now: float,
              signed: Sequence[str] = SIGNED_HEADERS, *, challenge: str | None = None) -> str | None:
        """None when the request is authentic and answers a live challenge of ours (which
        it then spends), else why it is refused. ``now``: this node's monotonic clock.
        With ``challenge`` the request must answer exactly that one, which the caller
        issued and keeps (a replication link's, spent with the link); the challenges of
        status answers are then not looked at."""
        value = headers.get(AUTH_HEADER)
        if not value:
            return "no cluster authentication (amq-ha-auth header missing)"
        parts = value.split(":")
        if len(parts) != 4 or parts[0] != _VERSION:
            return "malformed amq-ha-auth header (a node of another version?)"
        _v, answered, nonce, mac = parts
        if len(answered) != 32 or not 8 <= len(nonce) <= 64 or len(mac) != 64:
            return "malformed amq-ha-auth header"
        expected = _mac(self._secret, _canonical(request, headers, answered, nonce, signed))
        if not hmac.compare_digest(expected, mac.lower()):
            return "bad cluster secret (the MAC does not match: the nodes have different secrets)"
        if challenge is not None:
            if not hmac.compare_digest(answered, challenge):
                return "replayed request (it answers another link's challenge, not this one's)"
            return None
        self._forget(now)
        if self._issued.pop(answered, None) is None:
            return ("stale or replayed request (its challenge was not issued by this node, is spent, "
                    f"or is older than {self.ttl:.0f} s)")
        return None

    def _forget(self, now: float) -> None:
        issued = self._issued
        while issued and next(iter(issued.values())) < now:
            issued.popitem(last=False)
