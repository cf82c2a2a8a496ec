"""Option parsing for the ``amq`` Spark data source.

Spark hands a Python data source its options as a case-insensitive map whose keys
arrive **lower-cased** and whose values are strings (``.option("receiptWindow", 50)``
arrives as ``{"receiptwindow": "50"}``); ``.save(x)`` / ``.load(x)`` arrive as the
``path`` option. This module turns that map into frozen, validated dataclasses and
fails early, on the driver, with an error that names the bad option and lists the
valid ones. It is pure: no I/O, no Spark import, so it is unit- and fuzz-tested
without a SparkSession.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from amqtransport.errors import ConfigError

__all__ = [
    "WRITER_OPTIONS",
    "READER_OPTIONS",
    "TEST_FAIL_OPTION",
    "AmqSparkOptionError",
    "WriterOptions",
    "ReaderOptions",
    "parse_writer_options",
    "parse_reader_options",
    "normalize_destination",
    "reject_overwrite",
]

#: Test-only hook: raise in the first attempt of every task after sending this many
#: rows of its partition (exercises the retry path; never use it in a real job).
TEST_FAIL_OPTION = "test.failfirstattemptafter"

# Spelling shown to users (Spark lower-cases keys; both spellings are accepted).
_WRITER_SPELLING = {
    "uri": "uri",
    "destination": "destination",
    "login": "login",
    "passcode": "passcode",
    "persistent": "persistent",
    "receiptwindow": "receiptWindow",
    "idprefix": "idPrefix",
    "reportpath": "reportPath",
    "duplicateidheader": "duplicateIdHeader",
    "otelendpoint": "otelEndpoint",
    "traceparent": "traceparent",
    "path": "path",
    "checkpointlocation": "checkpointLocation",  # Spark's own (writeStream); ignored here
    TEST_FAIL_OPTION: "test.failFirstAttemptAfter",
}
_READER_SPELLING = {
    "uri": "uri",
    "destination": "destination",
    "login": "login",
    "passcode": "passcode",
    "walpath": "walPath",
    "maxbatchsize": "maxBatchSize",
    "receivetimeout": "receiveTimeout",
    "numpartitions": "numPartitions",
    "prefetch": "prefetch",
    "path": "path",
}

WRITER_OPTIONS: tuple[str, ...] = tuple(_WRITER_SPELLING.values())
READER_OPTIONS: tuple[str, ...] = tuple(_READER_SPELLING.values())

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class AmqSparkOptionError(ConfigError):
    """A bad option given to the ``amq`` data source; ``option`` names it, ``valid`` lists the good ones."""

    def __init__(self, message: str, *, option: str | None = None, valid: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.option = option
        self.valid = valid


@dataclass(frozen=True)
class WriterOptions:
    uri: str
    destination: str | None
    login: str | None = None
    passcode: str | None = None
    persistent: bool = True
    receipt_window: int = 100
    id_prefix: str | None = None
    report_path: str | None = None
    duplicate_id_header: str | None = None
    fail_first_attempt_after: int | None = None
    #: an OTLP/HTTP collector: a span per partition task, its rows' SENDs in its trace
    otel_endpoint: str | None = None
    #: the W3C traceparent the task spans continue (the driver's context); None: each task starts a trace
    traceparent: str | None = None

    def __repr__(self) -> str:  # never print the passcode
        return (
            f"WriterOptions(uri={self.uri!r}, destination={self.destination!r}, login={self.login!r}, "
            f"passcode={'***' if self.passcode else None}, persistent={self.persistent}, "
            f"receipt_window={self.receipt_window}, id_prefix={self.id_prefix!r})"
        )


@dataclass(frozen=True)
class ReaderOptions:
    uri: str
    destination: str
    wal_path: str
    login: str | None = None
    passcode: str | None = None
    max_batch_size: int = 10_000
    receive_timeout: float = 0.2
    num_partitions: int = 2
    prefetch: int = 1000

    def __repr__(self) -> str:
        return (
            f"ReaderOptions(uri={self.uri!r}, destination={self.destination!r}, wal_path={self.wal_path!r}, "
            f"login={self.login!r}, passcode={'***' if self.passcode else None}, "
            f"max_batch_size={self.max_batch_size}, receive_timeout={self.receive_timeout}, "
            f"num_partitions={self.num_partitions}, prefetch={self.prefetch})"
        )


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise AmqSparkOptionError(f"amq: option names must be strings, got {key!r}")
        out[key.lower()] = "" if value is None else str(value)
    return out


def _check_known(opts: Mapping[str, str], spelling: Mapping[str, str], what: str) -> None:
    unknown = sorted(k for k in opts if k not in spelling)
    if unknown:
        valid = tuple(spelling.values())
        raise AmqSparkOptionError(
            f"amq {what}: unknown option(s) {', '.join(repr(k) for k in unknown)}; "
            f"valid options are: {', '.join(valid)}",
            option=unknown[0],
            valid=valid,
        )


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise AmqSparkOptionError(f"amq: option {name} must be true or false, got {raw!r}", option=name)


def _int(opts: Mapping[str, str], key: str, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise AmqSparkOptionError(f"amq: option {name} must be an integer, got {raw!r}", option=name) from None
    if not minimum <= value <= maximum:
        raise AmqSparkOptionError(
            f"amq: option {name} must be between {minimum} and {maximum}, got {value}", option=name
        )
    return value


def _float(opts: Mapping[str, str], key: str, name: str, default: float, minimum: float, maximum: float) -> float:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise AmqSparkOptionError(f"amq: option {name} must be a number, got {raw!r}", option=name) from None
    if not minimum <= value <= maximum:  # also rejects nan
        raise AmqSparkOptionError(
            f"amq: option {name} must be between {minimum} and {maximum}, got {raw!r}", option=name
        )
    return value


def _text(opts: Mapping[str, str], key: str) -> str | None:
    raw = opts.get(key)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def normalize_destination(value: str, *, name: str = "destination") -> str:
    """``orders`` -> ``/queue/orders``; ``/queue/x`` and ``/topic/x`` pass unchanged."""
    text = value.strip()
    if not text:
        raise AmqSparkOptionError(f"amq: {name} must not be empty", option=name)
    if any(c in text for c in "\r\n\0"):
        raise AmqSparkOptionError(f"amq: {name} must not contain CR, LF or NUL: {value!r}", option=name)
    if text.startswith("/"):
        return text
    if text.startswith("queue://"):
        return "/queue/" + text[len("queue://"):]
    if text.startswith("topic://"):
        return "/topic/" + text[len("topic://"):]
    return "/queue/" + text


def _uri(opts: Mapping[str, str]) -> str:
    uri = _text(opts, "uri")
    if uri is None:
        raise AmqSparkOptionError(
            "amq: option uri is required, e.g. .option(\"uri\", "
            "\"failover:(tcp://a:61613,tcp://b:61613)?randomize=false\")",
            option="uri",
        )
    return uri


def parse_writer_options(options: Mapping[str, str]) -> WriterOptions:
    """Validate the options of ``df.write.format("amq")`` / ``writeStream``.

    ``destination`` may also come from ``.save("orders")`` (the ``path`` option) or,
    when neither is given, from a ``destination`` column in each row.
    """
    opts = _lower(options)
    _check_known(opts, _WRITER_SPELLING, "writer")
    uri = _uri(opts)
    dest_opt = _text(opts, "destination")
    path_opt = _text(opts, "path")
    if dest_opt is not None and path_opt is not None and normalize_destination(dest_opt) != normalize_destination(path_opt, name="path"):
        raise AmqSparkOptionError(
            f"amq writer: option destination {dest_opt!r} and save() path {path_opt!r} disagree; give one",
            option="destination",
        )
    destination = dest_opt or path_opt
    id_prefix = _text(opts, "idprefix")
    if id_prefix is not None and any(c in id_prefix for c in "\r\n\0:"):
        raise AmqSparkOptionError(f"amq: option idPrefix must not contain ':', CR, LF or NUL: {id_prefix!r}", option="idPrefix")
    dup_header = _text(opts, "duplicateidheader")
    if dup_header is not None and any(c in dup_header for c in "\r\n\0:"):
        raise AmqSparkOptionError(
            f"amq: option duplicateIdHeader must be a header name without ':', CR, LF or NUL: {dup_header!r}",
            option="duplicateIdHeader",
        )
    otel_endpoint = _text(opts, "otelendpoint")
    if otel_endpoint is not None:
        from amqtransport.broker.tracing import traces_url

        try:
            traces_url(otel_endpoint)
        except ValueError as exc:
            raise AmqSparkOptionError(f"amq: option otelEndpoint: {exc}", option="otelEndpoint") from None
    traceparent = _text(opts, "traceparent")
    if traceparent is not None:
        from amqtransport.broker.otlp import parse_traceparent

        if parse_traceparent(traceparent) is None:
            raise AmqSparkOptionError(
                f"amq: option traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got {traceparent!r}",
                option="traceparent")
    fail_after = None
    if TEST_FAIL_OPTION in opts:
        fail_after = _int(opts, TEST_FAIL_OPTION, "test.failFirstAttemptAfter", 0, 0, 2**31 - 1)
    return WriterOptions(
        uri=uri,
        destination=None if destination is None else normalize_destination(destination),
        login=_text(opts, "login"),
        passcode=opts.get("passcode"),
        persistent=_bool(opts, "persistent", "persistent", True),
        receipt_window=_int(opts, "receiptwindow", "receiptWindow", 100, 1, 1_000_000),
        id_prefix=id_prefix,
        report_path=_text(opts, "reportpath"),
        duplicate_id_header=dup_header,
        fail_first_attempt_after=fail_after,
        otel_endpoint=otel_endpoint,
        traceparent=traceparent,
    )


def parse_reader_options(options: Mapping[str, str]) -> ReaderOptions:
    """Validate the options of ``spark.readStream.format("amq")``."""
    opts = _lower(options)
    _check_known(opts, _READER_SPELLING, "reader")
    uri = _uri(opts)
    destination = _text(opts, "destination") or _text(opts, "path")
    if destination is None:
        raise AmqSparkOptionError("amq reader: option destination (a queue) is required", option="destination")
    destination = normalize_destination(destination)
    if destination.startswith("/topic/"):
        raise AmqSparkOptionError(
            "amq reader: only queues can be read at-least-once (a topic subscription loses what was "
            f"published while the query was down); got {destination!r}",
            option="destination",
        )
    wal = _text(opts, "walpath")
    if wal is None:
        raise AmqSparkOptionError(
            "amq reader: option walPath is required: a directory the driver can write, e.g. "
            "<checkpointLocation>/amq-wal (Spark does not tell a Python source its checkpoint location)",
            option="walPath",
        )
    return ReaderOptions(
        uri=uri,
        destination=destination,
        wal_path=wal,
        login=_text(opts, "login"),
        passcode=opts.get("passcode"),
        max_batch_size=_int(opts, "maxbatchsize", "maxBatchSize", 10_000, 1, 10_000_000),
        receive_timeout=_float(opts, "receivetimeout", "receiveTimeout", 0.2, 0.0, 60.0),
        num_partitions=_int(opts, "numpartitions", "numPartitions", 2, 1, 10_000),
        prefetch=_int(opts, "prefetch", "prefetch", 1000, 1, 1_000_000),
    )


def reject_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise AmqSparkOptionError(
            "amq writer: overwrite mode is not supported (a queue cannot be overwritten); "
            "use .mode(\"append\")",
            option="mode",
        )
