"""The bridge agent's TOML configuration, validated by pydantic.

Example (every key of ``[[network_connector]]`` except ``name`` and ``uri`` is optional)::

    local_uri = "failover:(tcp://127.0.0.1:61613,tcp://127.0.0.1:61623)?randomize=false"
    status_listen = "127.0.0.1:8162"          # HTTP status endpoint ("" or omitted: none)
    # broker_name = "spoke1"                  # our identity in the hop path (default: the
    #                                          # addresses of local_uri's brokers)
    # otel_endpoint = "http://127.0.0.1:4318" # OTLP/HTTP: a forward span per sampled message

    [[network_connector]]
    name = "spoke1-to-hub"
    uri = "masterslave:(tcp://127.0.0.1:61633,tcp://127.0.0.1:61643)"
    static_include = ["/queue/orders"]        # always forwarded
    dynamic_include = ["/queue/events.>"]     # forwarded while the remote has consumers
    exclude = ["/queue/local.>"]              # never forwarded (wins over includes)
    duplex = false                            # also forward remote -> local
    network_ttl = 1                           # max brokers a message may cross
    login = "bridge"                          # for the remote side
    passcode = "secret"
    local_login = "bridge"                    # for the local side
    local_passcode = "secret"
    prefetch = 1000                           # unacknowledged messages per forwarded destination
    #                                          # (ActiveMQ's networkConnector prefetchSize default)
    heartbeat_ms = 5000                       # STOMP heart-beats both ways, both sides
    advisories = "auto"                       # "on" | "off" | "auto": see bridge.connector
    loop_pause_ms = 1000                      # see "Loops" in bridge.forwarder
    receipt_timeout_ms = 30000                # a batch's receipts not all in by then: the bridge
    #                                          # is rebuilt (0: wait for ever)
    ack_mode = "client-individual"            # or "client": one cumulative ACK per batch
    #                                          # (half the frames; see bridge.forwarder)
    probe_interval_ms = 100                   # during the static back-off, TCP-probe the remote
    #                                          # brokers this often and rebuild as soon as one
    #                                          # accepts (0: ActiveMQ's behaviour, wait it out)
    # remote_name = "hub"                     # the remote's identity in the hop path
    # local_uri = "tcp://127.0.0.1:61653"     # this connector's own local broker (a hub agent
    #                                          # bridging many spokes); default: the top-level one
    # broker_name = "spoke7"                  # that local broker's identity in the hop path

``local_uri`` at the top level may be left out when every connector names its own.

Reconnect timing of a bridge is not configured here: it comes from the ``static:``
options in ``uri`` (``initialReconnectDelay``, ``maxReconnectDelay``,
``useExponentialBackOff``, ``backOffMultiplier``, ``minConnectTime``), exactly as in an
ActiveMQ ``<networkConnector uri="static:(...)?...">``.

Every problem is reported as one :class:`~amqtransport.errors.ConfigError` whose
message has a line per problem, each starting with the path of the key in the file
(``network_connector[0].network_ttl: must be >= 1``); ``error.path`` is the first one.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from amqtransport.destinations import overlaps, parse_pattern
from amqtransport.errors import AmqTransportError, ConfigError, DestinationError

__all__ = [
    "BridgeConfig",
    "NetworkConnectorConfig",
    "load_config",
    "parse_config",
    "config_from_mapping",
    "leaf_addresses",
    "services_and_options",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]+$")
_LISTEN_RE = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(?P<port>[0-9]{1,5})$")


def _uri_parser() -> Callable[[str], Any] | None:
    """amqtransport.uri.parse_uri when that module is present (it is built in parallel)."""
    try:
        from amqtransport import uri as uri_module
    except ImportError:
        return None
    parse: Callable[[str], Any] | None = getattr(uri_module, "parse_uri", None)
    return parse


def _check_uri(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    parse = _uri_parser()
    if parse is not None:
        try:
            parse(value)
        except AmqTransportError as exc:
            raise ValueError(f"bad URI: {exc}") from None
        except ValueError as exc:  # a stray ValueError from deep inside: still a config error
            raise ValueError(f"bad URI: {exc}") from None
    return value


def _check_name(value: str | None) -> str | None:
    """A broker name (``broker_name``, ``remote_name``): None, or letters, digits and ``_ . : @ -``."""
    if value is not None and not _NAME_RE.match(value):
        raise ValueError("must be non-empty and use only letters, digits and _ . : @ -")
    return value


def _check_patterns(values: list[str]) -> list[str]:
    for i, value in enumerate(values):
        try:
            parse_pattern(value)
        except DestinationError as exc:
            raise ValueError(f"[{i}] {exc}") from None
    return values


class NetworkConnectorConfig(BaseModel):
    """One ``[[network_connector]]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    uri: str
    static_include: list[str] = Field(default_factory=list)
    dynamic_include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    duplex: bool = False
    network_ttl: int = Field(default=1, ge=1, le=255)
    login: str | None = None
    passcode: str | None = None
    local_login: str | None = None
    local_passcode: str | None = None
    prefetch: int = Field(default=1000, ge=1, le=100000)
    heartbeat_ms: int = Field(default=5000, ge=0, le=3_600_000)
    advisories: Literal["auto", "on", "off"] = "auto"
    ack_mode: Literal["client-individual", "client"] = "client-individual"
    probe_interval_ms: int = Field(default=100, ge=0, le=60_000)
    loop_pause_ms: int = Field(default=1000, ge=0, le=3_600_000)
    receipt_timeout_ms: int = Field(default=30_000, ge=0, le=3_600_000)
    remote_name: str | None = None
    local_uri: str | None = None  # this connector's own local broker (default: the top-level one)
    broker_name: str | None = None  # its identity in the hop path (default: its addresses)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be non-empty and use only letters, digits and _ . : @ -")
        return v

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return _check_uri(v)

    @field_validator("static_include", "dynamic_include", "exclude")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        return _check_patterns(v)

    @field_validator("remote_name", "broker_name")
    @classmethod
    def _remote_name(cls, v: str | None) -> str | None:
        return _check_name(v)

    @field_validator("local_uri")
    @classmethod
    def _own_local_uri(cls, v: str | None) -> str | None:
        return v if v is None else _check_uri(v)


class BridgeConfig(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    local_uri: str | None = None  # required unless every connector has its own
    status_listen: str | None = "127.0.0.1:8162"
    broker_name: str | None = None
    # an OTLP/HTTP collector (http://HOST:PORT): a forward span per sampled message
    # (bridge.forwarder), the trace continued on the far side; off when unset
    otel_endpoint: str | None = None
    network_connector: list[NetworkConnectorConfig] = Field(min_length=1)

    @field_validator("otel_endpoint")
    @classmethod
    def _otel_endpoint(cls, v: str | None) -> str | None:
        if v is not None:
            from amqtransport.broker.tracing import traces_url

            traces_url(v)
        return v

    @field_validator("local_uri")
    @classmethod
    def _local_uri(cls, v: str | None) -> str | None:
        return v if v is None else _check_uri(v)

    def local_of(self, nc: NetworkConnectorConfig) -> str:
        """The local broker of connector ``nc``: its own ``local_uri``, else the file's."""
        local = nc.local_uri or self.local_uri
        assert local is not None, "validated: every connector has a local broker"
        return local

    def local_name_of(self, nc: NetworkConnectorConfig) -> str | None:
        """The name of connector ``nc``'s local broker in the hop path (None: its addresses)."""
        if nc.broker_name:
            return nc.broker_name
        return self.broker_name if nc.local_uri is None else None

    @field_validator("status_listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        m = _LISTEN_RE.match(v)
        if not m or int(m.group("port")) > 65535:
            raise ValueError("must be HOST:PORT with a port from 0 to 65535, e.g. 127.0.0.1:8162")
        return v

    @field_validator("broker_name")
    @classmethod
    def _broker_name(cls, v: str | None) -> str | None:
        return _check_name(v)

    @property
    def status_address(self) -> tuple[str, int] | None:
        if self.status_listen is None:
            return None
        host, _, port = self.status_listen.rpartition(":")
        return (host.strip("[]") or "127.0.0.1", int(port))


# --------------------------------------------------------------------------- errors


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(top level)"


def _format_msg(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge')}"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le')}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} entries"
    if kind == "int_type":
        return "must be an integer"
    if kind == "bool_type":
        return "must be true or false"
    if kind in ("string_type", "str_type"):
        return "must be a string"
    if kind == "list_type":
        return "must be a list"
    if kind == "model_type":
        return "must be a table"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    msg = str(err.get("msg", "invalid"))
    if kind == "value_error" and msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


def _lines_of(exc: ValidationError) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        msg = _format_msg(err)
        # list validators report the failing index in the message as "[i] ..."
        m = re.match(r"^\[(\d+)\] (.*)$", msg, re.S)
        if m:
            loc = (*loc, int(m.group(1)))
            msg = m.group(2)
        out.append((_format_loc(loc), msg))
    return out


def _raise(lines: list[tuple[str, str]], source: str | None) -> None:
    text = "\n".join(f"{path}: {msg}" for path, msg in lines)
    if source:
        text = f"{source}: invalid bridge config\n{text}" if len(lines) > 1 else f"{source}: {text}"
    raise ConfigError(text, path=lines[0][0])


# --------------------------------------------------------------------------- semantics


def _cross_checks(cfg: BridgeConfig) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, nc in enumerate(cfg.network_connector):
        base = f"network_connector[{i}]"
        if nc.name in seen:
            problems.append((f"{base}.name", f"duplicate name {nc.name!r} (also network_connector[{seen[nc.name]}])"))
        seen.setdefault(nc.name, i)
        if not nc.static_include and not nc.dynamic_include:
            problems.append((f"{base}", "nothing to forward: give static_include and/or dynamic_include"))
        excludes = [parse_pattern(e) for e in nc.exclude]
        for j, inc in enumerate(nc.static_include):
            p = parse_pattern(inc)
            for k, ex in enumerate(excludes):
                if not overlaps(p, ex):
                    continue
                if not p.has_wildcard:
                    problems.append((f"{base}.static_include[{j}]", f"{inc!r} is excluded by exclude[{k}] {nc.exclude[k]!r}"))
                elif p.is_queue:
                    problems.append((
                        f"{base}.static_include[{j}]",
                        f"wildcard queue include {inc!r} overlaps exclude[{k}] {nc.exclude[k]!r}: the bridge would "
                        "consume excluded queue messages; list the queues explicitly or use dynamic_include",
                    ))
        if nc.local_uri is None and cfg.local_uri is None:
            problems.append((f"{base}.local_uri", "no local broker: give local_uri here or at the top level"))
        same = set(leaf_addresses(nc.local_uri or cfg.local_uri or "")) & set(leaf_addresses(nc.uri))
        if same:
            problems.append((f"{base}.uri", f"points at the local broker ({', '.join(sorted(same))}): "
                                            "a bridge must connect two different brokers"))
        if (nc.login is None) != (nc.passcode is None):
            problems.append((f"{base}.passcode" if nc.passcode is None else f"{base}.login", "login and passcode go together"))
        if (nc.local_login is None) != (nc.local_passcode is None):
            problems.append((
                f"{base}.local_passcode" if nc.local_passcode is None else f"{base}.local_login",
                "local_login and local_passcode go together",
            ))
    return problems


def config_from_mapping(data: Mapping[str, Any], *, source: str | None = None) -> BridgeConfig:
    """Validate an already-parsed TOML document."""
    if not isinstance(data, Mapping):
        raise ConfigError("the config must be a TOML table", path="(top level)")
    try:
        cfg = BridgeConfig.model_validate(dict(data))
    except ValidationError as exc:
        _raise(_lines_of(exc), source)
        raise  # unreachable: _raise always raises
    problems = _cross_checks(cfg)
    if problems:
        _raise(problems, source)
    return cfg


def parse_config(text: str, *, source: str | None = None) -> BridgeConfig:
    """Parse and validate TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source + ': ' if source else ''}not valid TOML: {exc}", path="(toml)") from None
    return config_from_mapping(data, source=source)


def load_config(path: str | Path) -> BridgeConfig:
    """Read, parse and validate a config file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}", path=None) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8: {exc}", path="(toml)") from None
    return parse_config(text, source=str(p))


# --------------------------------------------------------------------------- URI helpers

_ADDR_RE = re.compile(r"(?:tcp|stomp|ssl|stomp\+ssl)://([^,()?/&]+)")


def leaf_addresses(uri: str) -> tuple[str, ...]:
    """Sorted ``tcp://host:port`` addresses of every leaf in ``uri`` (the broker identity
    used in the hop path when no explicit name is configured)."""
    parse = _uri_parser()
    found: set[str] = set()
    if parse is not None:
        try:
            node = parse(uri)
        except Exception:  # noqa: BLE001 - validated earlier; fall back to the regex below
            node = None
        if node is not None:
            stack = [node]
            while stack:
                n = stack.pop()
                comps = getattr(n, "components", None)
                if comps is not None:
                    stack.extend(comps)
                else:
                    addr = getattr(n, "address", None)
                    if addr:
                        found.add(str(addr))
            if found:
                return tuple(sorted(found))
    for m in _ADDR_RE.finditer(uri):
        hostport = m.group(1)
        if ":" not in hostport.rsplit("]", 1)[-1]:
            hostport += ":61613"
        found.add(f"tcp://{hostport}")
    return tuple(sorted(found)) or (uri,)


def services_and_options(uri: str) -> tuple[list[str], Any]:
    """(services, StaticOptions) for a network connector URI.

    ``static:(u1,u2)`` gives one service per URI; ``masterslave:(a,b)`` and
    ``static:failover:(a,b)?...`` give one failover service; any other URI is one
    service with the default ``static:`` options.
    """
    from amqtransport.transports.discovery import services_of

    services, options = services_of(uri.strip())
    return list(services), options
