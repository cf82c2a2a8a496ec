"""Option models for connection URIs (pydantic v2, frozen, unknown keys rejected).

Theory of operation
-------------------
Every model has snake_case attribute names (``initial_reconnect_delay``) and accepts
ActiveMQ's camelCase names as aliases (``initialReconnectDelay``); both spellings are
accepted when a model is built from Python (``FailoverOptions(randomize=False)`` or
``FailoverOptions.model_validate({"randomize": False})``).  Values coming from a URI are
strings, so every field has a strict *before* validator:

* booleans accept ``true`` / ``false`` (any case) and real ``bool`` values only, not
  ``1``, ``yes`` or ``on`` (pydantic's lax rules would take those);
* integers accept an optional ``-`` and decimal digits (or a real ``int``), never a float
  or a bool;
* floats accept decimal / exponent notation, never ``nan`` or ``inf``.

Times are milliseconds (ints).  ``amqtransport.uri`` turns pydantic's ``ValidationError``
into a :class:`~amqtransport.errors.UriError`; nothing here knows about URI text.

``model_fields_set`` records which options were *given*: the canonical URI (``str()`` of
a parsed tree) writes exactly those, and ``amq uri explain`` marks non-default values.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

__all__ = [
    "DIALECTS",
    "FailoverOptions",
    "StaticOptions",
    "LeafOptions",
    "option_names",
    "activemq_name",
    "SSL_ONLY_OPTIONS",
]

_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_HEARTBEAT_RE = re.compile(r"\s*([0-9]{1,9})\s*,\s*([0-9]{1,9})\s*")


def _strict_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low == "true":
            return True
        if low == "false":
            return False
    raise ValueError(f"expected true or false, got {value!r}")


def _strict_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        return int(value.strip())
    raise ValueError(f"expected an integer, got {value!r}")


def _strict_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
        result = float(value.strip())
    else:
        raise ValueError(f"expected a number, got {value!r}")
    if not math.isfinite(result):
        raise ValueError(f"expected a finite number, got {value!r}")
    return result


def _text(value: Any) -> Any:
    if isinstance(value, str):
        if value == "":
            raise ValueError("expected a non-empty value")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError("control characters are not allowed")
        return value
    raise ValueError(f"expected text, got {value!r}")


def _uri_list(value: Any) -> Any:
    """``priorityURIs``: a comma-separated string or a sequence of strings."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple):
        items = []
        for part in value:
            if not isinstance(part, str):
                raise ValueError(f"expected URI strings, got {part!r}")
            items.append(part.strip())
    else:
        raise ValueError(f"expected a comma-separated list of URIs, got {value!r}")
    return tuple(item for item in items if item)


DIALECTS = ("amq", "activemq", "artemis", "rabbitmq")


def _dialect(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in DIALECTS:
        return value.strip().lower()
    raise ValueError(f"expected one of {', '.join(DIALECTS)}, got {value!r}")


def _header_name(value: Any) -> Any:
    text = _text(value)
    if any(ch in text for ch in ":\r\n\x00"):
        raise ValueError(f"expected a header name (no ':', CR, LF or NUL), got {value!r}")
    return text


def _heartbeat(value: Any) -> Any:
    if isinstance(value, tuple | list) and len(value) == 2:
        value = f"{_strict_int(value[0])},{_strict_int(value[1])}"
    if isinstance(value, str):
        match = _HEARTBEAT_RE.fullmatch(value)
        if match:
            return f"{int(match.group(1))},{int(match.group(2))}"
    raise ValueError(f"expected 'cx,cy' (two non-negative integers in ms), got {value!r}")


Bool = Annotated[bool, BeforeValidator(_strict_bool)]
Int = Annotated[int, BeforeValidator(_strict_int)]
Float = Annotated[float, BeforeValidator(_strict_float)]
Text = Annotated[str, BeforeValidator(_text)]
UriList = Annotated[tuple[str, ...], BeforeValidator(_uri_list)]
HeartBeat = Annotated[str, BeforeValidator(_heartbeat)]
DialectName = Annotated[str, BeforeValidator(_dialect)]
HeaderName = Annotated[str, BeforeValidator(_header_name)]

_CONFIG = ConfigDict(
    frozen=True,
    extra="forbid",
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=False,
    validate_default=False,
)


class _Options(BaseModel):
    model_config = _CONFIG

    def given(self) -> dict[str, Any]:
        """The options that were given explicitly, by ActiveMQ name, in field order."""
        return {
            activemq_name(type(self), name): getattr(self, name)
            for name in type(self).model_fields
            if name in self.model_fields_set
        }

    def effective(self) -> dict[str, Any]:
        """Every option (defaults included) by ActiveMQ name, JSON-friendly values."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            out[activemq_name(type(self), name)] = list(value) if isinstance(value, tuple) else value
        return out

    def non_default(self) -> set[str]:
        """ActiveMQ names of options whose value differs from the default."""
        out: set[str] = set()
        for name, info in type(self).model_fields.items():
            if getattr(self, name) != info.default:
                out.add(activemq_name(type(self), name))
        return out


def _opt(default: Any, name: str, *aliases: str, **constraints: Any) -> Any:
    """A field known as ``name`` (its ActiveMQ name) in URIs, JSON and error messages.

    Only ``validation_alias`` / ``serialization_alias`` are set (not ``alias``), so type
    checkers see the snake_case names in ``__init__`` while both spellings validate.
    """
    validation: str | AliasChoices = AliasChoices(name, *aliases) if aliases else name
    return Field(
        default=default, validation_alias=validation, serialization_alias=name, **constraints
    )


class FailoverOptions(_Options):
    """``failover:`` options with ActiveMQ's names and (5.6+) defaults."""

    randomize: Bool = _opt(True, "randomize")
    initial_reconnect_delay: Int = _opt(10, "initialReconnectDelay", ge=0)
    max_reconnect_delay: Int = _opt(30000, "maxReconnectDelay", ge=0)
    use_exponential_backoff: Bool = _opt(True, "useExponentialBackOff")
    reconnect_delay_exponent: Float = _opt(
        2.0, "reconnectDelayExponent", "backOffMultiplier", ge=1.0
    )
    max_reconnect_attempts: Int = _opt(-1, "maxReconnectAttempts", ge=-1)
    startup_max_reconnect_attempts: Int = _opt(-1, "startupMaxReconnectAttempts", ge=-1)
    timeout: Int = _opt(-1, "timeout", ge=-1)
    priority_backup: Bool = _opt(False, "priorityBackup")
    priority_uris: UriList = _opt((), "priorityURIs")
    backup: Bool = _opt(False, "backup")
    backup_pool_size: Int = _opt(1, "backupPoolSize", ge=0)
    track_messages: Bool = _opt(False, "trackMessages")
    max_cache_size: Int = _opt(131072, "maxCacheSize", ge=0)
    warn_after_reconnect_attempts: Int = _opt(10, "warnAfterReconnectAttempts", ge=0)
    update_uris_url: Text | None = _opt(None, "updateURIsURL")
    reconnect_jitter: Float = _opt(0.0, "reconnectJitter", ge=0.0, le=1.0)
    #: ms between bare TCP probes of the endpoints while the back-off sleeps (0: off)
    probe_interval: Int = _opt(100, "probeInterval", ge=0)


def _static_attempts(value: Any) -> Any:
    """SimpleDiscoveryAgent gives up only past a positive limit: any value <= 0 is unlimited (0)."""
    number = _strict_int(value)
    return 0 if number < 0 else number


class StaticOptions(_Options):
    """``static:`` discovery options (ActiveMQ's SimpleDiscoveryAgent).

    ``maxReconnectAttempts`` 0 means unlimited here (the opposite sign convention to
    ``failover:``, as in ActiveMQ); a negative value is unlimited too, so it reads as 0.
    """

    initial_reconnect_delay: Int = _opt(1000, "initialReconnectDelay", ge=0)
    max_reconnect_delay: Int = _opt(30000, "maxReconnectDelay", ge=0)
    use_exponential_backoff: Bool = _opt(True, "useExponentialBackOff")
    backoff_multiplier: Int = _opt(2, "backOffMultiplier", ge=1)
    max_reconnect_attempts: Annotated[int, BeforeValidator(_static_attempts)] = _opt(0, "maxReconnectAttempts", ge=0)
    min_connect_time: Int = _opt(5000, "minConnectTime", ge=0)


class LeafOptions(_Options):
    """Options of one broker URI (``tcp://``, ``ssl://``, ``vm://``).

    ``caFile``, ``certFile``, ``keyFile``, ``verify`` and ``serverHostname`` apply to
    ``ssl://`` only (the URI parser rejects them on other schemes).
    """

    connect_timeout: Int = _opt(10000, "connectTimeout", ge=0)
    heart_beat: HeartBeat = _opt("10000,10000", "heartBeat")
    #: the CONNECT ``host`` header: RabbitMQ's virtual host (default ``/``)
    host: Text | None = _opt(None, "host", "vhost")
    #: the broker's STOMP dialect (default: detected from CONNECTED's ``server``)
    dialect: DialectName | None = _opt(None, "dialect")
    #: text bodies without content-length (JMS TextMessage); default per dialect
    text_mode: Bool | None = _opt(None, "textMode")
    #: a header that also carries the idempotency key (``_AMQ_DUPL_ID`` for Artemis'
    #: duplicate detection, its default there; ``none`` turns it off)
    duplicate_id_header: HeaderName | None = _opt(None, "duplicateIdHeader")
    ca_file: Text | None = _opt(None, "caFile")
    cert_file: Text | None = _opt(None, "certFile")
    key_file: Text | None = _opt(None, "keyFile")
    verify: Bool = _opt(True, "verify")
    server_hostname: Text | None = _opt(None, "serverHostname")

    @property
    def heartbeat(self) -> tuple[int, int]:
        """``heartBeat`` as ``(cx, cy)`` milliseconds."""
        cx, cy = self.heart_beat.split(",")
        return int(cx), int(cy)


SSL_ONLY_OPTIONS: frozenset[str] = frozenset(
    {"caFile", "certFile", "keyFile", "verify", "serverHostname"}
)


def activemq_name(model: type[BaseModel], field: str) -> str:
    """The ActiveMQ (camelCase) name of ``field``."""
    info = model.model_fields[field]
    alias = info.serialization_alias or info.alias
    return alias if alias else field


def option_names(model: type[BaseModel]) -> dict[str, str]:
    """Map every name accepted in a URI (ActiveMQ names and aliases) to the field name."""
    out: dict[str, str] = {}
    for field, info in model.model_fields.items():
        out[activemq_name(model, field)] = field
        choices = info.validation_alias
        if isinstance(choices, str):
            out[choices] = field
        elif isinstance(choices, AliasChoices):
            for choice in choices.choices:
                if isinstance(choice, str) and choice != field:
                    out[choice] = field
    return out
