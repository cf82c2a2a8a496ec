"""Broker configuration (pydantic, from TOML) and the users file.

A config file is TOML with the keys of :class:`BrokerConfig`, either at the top level
or under a ``[broker]`` table. Unknown keys and bad values raise
:class:`~amqtransport.errors.ConfigError` naming the key. The users file has one
``user:password`` per line (``#`` comments and blank lines ignored); the password may
be stored hashed as ``sha256$<salt>$<hex of sha256(salt + password)>`` (see
:func:`hash_password`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from amqtransport.errors import ConfigError

if TYPE_CHECKING:
    from .authorization import Authorizer

__all__ = [
    "BrokerConfig",
    "load_config",
    "load_users",
    "hash_password",
    "read_toml",
    "verify_password",
    "check_login",
    "parse_http_address",
]

MiB = 1024 * 1024


class BrokerConfig(BaseModel):
    """Every tunable of the embedded broker; all have working defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=61613, ge=0, le=65535)
    name: str = "embedded"
    data_dir: str | None = None
    users_file: str | None = None

    # limits
    max_connections: int = Field(default=1000, ge=1)
    max_frame_size: int = Field(default=10 * MiB, ge=256)
    max_headers: int = Field(default=1000, ge=1)
    max_header_line: int = Field(default=64 * 1024, ge=64)
    max_pending_frames: int = Field(default=10000, ge=1)
    write_buffer_high: int = Field(default=1 * MiB, ge=4096)
    max_subscriptions: int = Field(default=1000, ge=1)
    max_transactions: int = Field(default=100, ge=1)
    # bytes of SENDs one transaction may hold until COMMIT (at most half the journal's
    # 1 GiB record limit: a commit is one record, durable topic copies included)
    max_transaction_size: int = Field(default=64 * MiB, ge=1024, le=512 * MiB)
    connect_timeout_ms: int = Field(default=10000, ge=1)
    # before CONNECTED (no login yet): bytes of a frame, and how many such connections;
    # together they bound what unauthenticated peers make the broker hold
    max_connect_frame_size: int = Field(default=64 * 1024, ge=256)
    max_unauthenticated: int = Field(default=100, ge=1)
    # the total bytes of partial frames buffered for connections not logged in (counted in
    # memory_limit too): the connection whose bytes would pass it is refused
    max_unauthenticated_bytes: int = Field(default=2 * MiB, ge=256)
    # a frame must be complete this long after its first byte (while the broker reads)
    frame_timeout_ms: int = Field(default=120_000, ge=1)

    # memory limits / producer flow control (see amqtransport.broker.dispatch.memory)
    memory_limit: int = Field(default=256 * MiB, ge=4096)
    destination_memory_limit: int = Field(default=0, ge=0)  # 0: only the global limit
    memory_low_water: float = Field(default=0.7, gt=0.0, lt=1.0)
    send_fail_if_no_space: bool = False

    # heart-beats: the broker can send / wants to receive no faster than these
    heartbeat_send_min_ms: int = Field(default=100, ge=0)
    heartbeat_receive_min_ms: int = Field(default=100, ge=0)
    heartbeat_grace: float = Field(default=2.0, ge=1.0)

    # delivery
    default_prefetch: int = Field(default=1000, ge=1)
    max_redeliveries: int = Field(default=6, ge=-1)
    dlq_prefix: str = "DLQ."
    topic_backlog_limit: int = Field(default=10000, ge=1)
    topic_backlog_bytes: int = Field(default=64 * MiB, ge=1024)
    advisories: bool = True
    # queues deliver higher `priority` first, FIFO within one (dispatch/priority.py); false:
    # FIFO whatever the priority (ActiveMQ's default, without prioritizedMessages)
    prioritized_messages: bool = True
    # AMQ_SCHEDULED_* headers schedule a message (ActiveMQ's schedulerSupport); false: delivered at once
    scheduler_support: bool = True

    # persistence
    fsync: bool = True
    segment_size: int = Field(default=32 * MiB, ge=4096)
    compact_interval_ms: int = Field(default=1000, ge=10)
    compact_relocate_max: int = Field(default=10000, ge=0)
    dedupe_window_size: int = Field(default=100_000, ge=0)
    dedupe_window_seconds: float = Field(default=3600.0, ge=0)
    # bytes of journal on disk at which persistent producers are flow-controlled (0: no
    # limit; ActiveMQ's storeUsage); released at memory_low_water x the limit
    store_limit: int = Field(default=0, ge=0)
    # paging (queues.py): persistent messages a queue keeps in memory; the rest wait on disk
    page_window: int = Field(default=1000, ge=1)
    # bytes of journal between index checkpoints (store/checkpoint.py; at least the size of
    # the last checkpoint); 0: only at a clean stop
    checkpoint_interval: int = Field(default=32 * MiB, ge=0)

    @field_validator("store_limit")
    @classmethod
    def _store_limit_room(cls, value: int, info: ValidationInfo) -> int:
        segment = info.data.get("segment_size")
        if value and isinstance(segment, int) and value < 4 * segment:
            raise ValueError(
                f"must be 0 (no limit) or at least 4 x segment_size ({4 * segment} bytes): only whole "
                "segments are freed, the newest one never"
            )
        return value

    log_level: str = "INFO"

    # the HTTP side port: /metrics, /healthz, /readyz, the console (docs/console.md);
    # "HOST:PORT" or "PORT" (host 127.0.0.1); off when unset
    http: str | None = None
    # /readyz answers 503 once producer flow control has held this long without a break
    http_ready_flow_control_seconds: float = Field(default=30.0, gt=0)

    # STOMP over WebSocket (connection/websocket.py, docs/websocket.md): "HOST:PORT" or
    # "PORT"; off when unset. Opened and closed with the client port (an HA slave's stays
    # closed until it takes over)
    ws: str | None = None
    # the browser Origins allowed to open a WebSocket ("*": any, as ActiveMQ's default);
    # a client that sends no Origin is not a browser and is always let through
    ws_allowed_origins: list[str] = Field(default_factory=lambda: ["*"])

    # destination authorization (broker/authorization.py, as ActiveMQ's authorizationPlugin):
    # [[authorization]] entries (queue = or topic = a pattern; read, write, admin = groups),
    # the groups as a [groups] table (group -> users) and/or an ActiveMQ groups.properties file
    authorization: list[dict[str, Any]] = Field(default_factory=list)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    groups_file: str | None = None
    # a second connection with the client-id of a connected one: refused (ActiveMQ's
    # default), or with true the new one takes over and the old is closed
    allow_link_stealing: bool = False

    # OpenTelemetry (broker/tracing.py, docs/tracing.md): an OTLP/HTTP collector URL
    # (http://HOST:PORT, traces POSTed to /v1/traces) to which a server span per sampled
    # SEND is exported, with its journal fsync and replication wait; off when unset.
    # Spans wait in a queue of otel_queue_size; a full queue or a failed POST drops them
    otel_endpoint: str | None = None
    otel_queue_size: int = Field(default=2048, ge=1)

    # a replicated HA node's witness (broker/ha/witness.py, docs/ha.md): "HOST:PORT" of an
    # `amq broker witness`; the same as `witness` in the [ha] table or --witness. Unset: no
    # witness (a master that loses its slave holds receipts until its peer answers)
    witness: str | None = None

    # an HA node that is not master but knows a live master relays clients to it on this
    # port (broker/ha/relay.py, docs/ha.md; 0: a free one): the same as `relay_port` in the
    # [ha] table or --relay-port. Unset: no relay (the client port is the master's alone)
    relay_port: int | None = Field(default=None, ge=0, le=65535)

    @field_validator("witness")
    @classmethod
    def _witness(cls, value: str | None) -> str | None:
        if value is not None:
            host, sep, port = value.strip().removeprefix("tcp://").rpartition(":")
            if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
                raise ValueError(f"expected HOST:PORT of an `amq broker witness`, got {value!r}")
        return value

    @field_validator("otel_endpoint")
    @classmethod
    def _otel_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            from .tracing import traces_url

            traces_url(value)
        return value

    @field_validator("authorization")
    @classmethod
    def _authorization_entries(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from .authorization import parse_entries

        try:
            parse_entries(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    def authorizer(self) -> Authorizer:
        """The :class:`~.authorization.Authorizer` of these entries and groups (reads
        ``groups_file``: ConfigError naming it when it cannot)."""
        from .authorization import Authorizer, load_groups, parse_entries

        return Authorizer(parse_entries(self.authorization), load_groups(self.groups_file, self.groups))

    @field_validator("http")
    @classmethod
    def _http_address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_http_address(value)
        return value

    @field_validator("ws")
    @classmethod
    def _ws_address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_http_address(value, "the WebSocket port")
        return value


def parse_http_address(text: str, what: str = "the HTTP side port") -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (host 127.0.0.1) -> (host, port); port 0
    means any free port. ValueError naming the problem (and ``what`` it is for) otherwise."""
    raw = str(text).strip()
    host, sep, port = raw.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", raw
    host = host.strip("[]")
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:  # '²'.isdigit() is True
        raise ValueError(f"expected HOST:PORT or PORT (0-65535) for {what}, got {text!r}")
    if sep and not host:
        raise ValueError(f"empty host in the address of {what} {text!r} (write 127.0.0.1:PORT, or 0.0.0.0:PORT "
                         "deliberately)")
    return host, int(port)


def _describe(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = ", ".join(BrokerConfig.model_fields)
            parts.append(f"unknown key '{key}' (valid keys: {valid})")
        else:
            parts.append(f"key '{key}': {err['msg']}")
    return f"{source}: " + "; ".join(parts)


def config_from_mapping(data: Mapping[str, Any], source: str = "config") -> BrokerConfig:
    """Validate a mapping (top-level keys or a ``broker`` table)."""
    data = {k: v for k, v in data.items() if k != "ha"}  # [ha]: validated by amqtransport.broker.ha.config
    if "broker" in data and isinstance(data["broker"], Mapping):
        extra = [k for k in data if k != "broker"]
        if extra:
            raise ConfigError(f"{source}: unknown key '{extra[0]}' next to the [broker] table", path=extra[0])
        data = data["broker"]
    try:
        return BrokerConfig.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        raise ConfigError(_describe(exc, source), path=".".join(str(x) for x in first)) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML file (the broker's, including its ``[ha]`` table); :class:`ConfigError`
    when it cannot be read or is not TOML."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None


def load_config(path: str | Path) -> BrokerConfig:
    """Read and validate a TOML config file; :class:`ConfigError` names the bad key."""
    return config_from_mapping(read_toml(path), str(Path(path)))


def hash_password(password: str, salt: str | None = None) -> str:
    """The hashed users-file form ``sha256$salt$hex``."""
    salt = salt if salt is not None else secrets.token_hex(8)
    if "$" in salt or ":" in salt:
        raise ValueError("salt must not contain '$' or ':'")
    digest = hashlib.sha256((salt + password).encode("utf-8")).hexdigest()
    return f"sha256${salt}${digest}"


def verify_password(stored: str, given: str) -> bool:
    """Constant-time check of ``given`` against a plain or ``sha256$salt$hex`` entry."""
    if stored.startswith("sha256$"):
        parts = stored.split("$")
        if len(parts) != 3:
            return False
        _, salt, digest = parts
        got = hashlib.sha256((salt + given).encode("utf-8")).hexdigest()
        return hmac.compare_digest(got, digest.lower())
    return hmac.compare_digest(stored.encode("utf-8"), given.encode("utf-8"))


def check_login(users: Mapping[str, str], login: str | None, passcode: str | None) -> bool:
    """Whether ``login`` is one of ``users`` and ``passcode`` its password (a missing login
    never is; a missing passcode is the empty one). The one password check of the broker:
    client logins, status requests, replication links and the web console."""
    stored = users.get(login) if login is not None else None
    return stored is not None and verify_password(stored, passcode or "")


def load_users(path: str | Path) -> dict[str, str]:
    """Parse a users file into ``{user: stored_password}``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read users file: {exc.strerror or exc}") from None
    users: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        user = user.strip()
        if not sep or not user:
            raise ConfigError(f"{p}:{n}: expected 'user:password', got {line[:40]!r}", path=f"line {n}")
        if password.startswith("sha256$") and password.count("$") != 2:
            raise ConfigError(f"{p}:{n}: hashed password must be sha256$salt$hex", path=f"line {n}")
        users[user] = password
    if not users:
        raise ConfigError(f"{p}: no users defined (authentication would refuse everyone)")
    return users
