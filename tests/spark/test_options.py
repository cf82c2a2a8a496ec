"""Option parsing and id making of the ``amq`` data source (pure: no SparkSession)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.errors import ConfigError
from amqtransport.spark.ids import batch_key, column_key, new_run_id, stream_key
from amqtransport.spark.options import (
    READER_OPTIONS,
    WRITER_OPTIONS,
    AmqSparkOptionError,
    normalize_destination,
    parse_reader_options,
    parse_writer_options,
    reject_overwrite,
)

URI = "failover:(tcp://127.0.0.1:1,tcp://127.0.0.1:2)?randomize=false"


def test_writer_defaults_and_lowercased_keys() -> None:
    o = parse_writer_options({"uri": URI, "destination": "orders"})
    assert o.uri == URI and o.destination == "/queue/orders"
    assert o.persistent is True and o.receipt_window == 100 and o.id_prefix is None
    o = parse_writer_options(
        {"uri": URI, "destination": "/topic/t", "receiptwindow": "7", "persistent": "FALSE", "idprefix": "job1",
         "login": "u", "passcode": "p"}
    )
    assert (o.destination, o.receipt_window, o.persistent, o.id_prefix, o.login, o.passcode) == (
        "/topic/t", 7, False, "job1", "u", "p")
    assert parse_writer_options({"uri": URI, "destination": "q", "duplicateidheader": "_AMQ_DUPL_ID"}
                                ).duplicate_id_header == "_AMQ_DUPL_ID"
    # camelCase keys (when called outside Spark) mean the same
    assert parse_writer_options({"uri": URI, "receiptWindow": "3", "destination": "x"}).receipt_window == 3


def test_passcode_is_not_in_repr() -> None:
    assert "s3cret" not in repr(parse_writer_options({"uri": URI, "destination": "q", "passcode": "s3cret"}))
    assert "s3cret" not in repr(
        parse_reader_options({"uri": URI, "destination": "q", "walpath": "/tmp/w", "passcode": "s3cret"})
    )


def test_save_path_is_the_destination() -> None:
    assert parse_writer_options({"uri": URI, "path": "/queue/a"}).destination == "/queue/a"
    assert parse_writer_options({"uri": URI, "path": "a", "destination": "/queue/a"}).destination == "/queue/a"
    with pytest.raises(AmqSparkOptionError, match="disagree"):
        parse_writer_options({"uri": URI, "path": "a", "destination": "b"})


def test_unknown_option_lists_valid_ones() -> None:
    with pytest.raises(AmqSparkOptionError) as ei:
        parse_writer_options({"uri": URI, "destination": "q", "recieptwindow": "5"})
    msg = str(ei.value)
    assert "'recieptwindow'" in msg and "receiptWindow" in msg and "idPrefix" in msg
    assert ei.value.option == "recieptwindow" and ei.value.valid == WRITER_OPTIONS
    assert isinstance(ei.value, ConfigError) and isinstance(ei.value, ValueError)
    with pytest.raises(AmqSparkOptionError, match="walPath"):
        parse_reader_options({"uri": URI, "destination": "q", "walpath": "/w", "receiptwindow": "1"})


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        ({"destination": "q"}, "uri is required"),
        ({"uri": " ", "destination": "q"}, "uri is required"),
        ({"uri": URI, "destination": "q", "receiptwindow": "0"}, "receiptWindow must be between 1"),
        ({"uri": URI, "destination": "q", "receiptwindow": "ten"}, "receiptWindow must be an integer"),
        ({"uri": URI, "destination": "q", "persistent": "maybe"}, "persistent must be true or false"),
        ({"uri": URI, "destination": "q", "idprefix": "a:b"}, "idPrefix must not contain"),
        ({"uri": URI, "destination": "q\nx"}, "must not contain CR"),
        ({"uri": URI, "destination": "q", "duplicateidheader": "a:b"}, "duplicateIdHeader must be a header name"),
    ],
)
def test_bad_writer_values(opts: dict[str, str], needle: str) -> None:
    with pytest.raises(AmqSparkOptionError, match=needle):
        parse_writer_options(opts)


def test_reader_options() -> None:
    o = parse_reader_options({"uri": URI, "destination": "in", "walpath": "/tmp/w", "maxbatchsize": "50",
                              "numpartitions": "3", "receivetimeout": "0.5"})
    assert (o.destination, o.wal_path, o.max_batch_size, o.num_partitions, o.receive_timeout) == (
        "/queue/in", "/tmp/w", 50, 3, 0.5)
    with pytest.raises(AmqSparkOptionError, match="walPath is required"):
        parse_reader_options({"uri": URI, "destination": "in"})
    with pytest.raises(AmqSparkOptionError, match="destination .*is required"):
        parse_reader_options({"uri": URI, "walpath": "/w"})
    with pytest.raises(AmqSparkOptionError, match="only queues"):
        parse_reader_options({"uri": URI, "destination": "/topic/t", "walpath": "/w"})
    with pytest.raises(AmqSparkOptionError, match="receiveTimeout"):
        parse_reader_options({"uri": URI, "destination": "q", "walpath": "/w", "receivetimeout": "nan"})
    assert "walPath" in READER_OPTIONS


def test_overwrite_is_rejected() -> None:
    reject_overwrite(False)
    with pytest.raises(AmqSparkOptionError, match=r"overwrite mode is not supported.*append"):
        reject_overwrite(True)


def test_destination_normalization() -> None:
    assert normalize_destination("x") == "/queue/x"
    assert normalize_destination("queue://x") == "/queue/x"
    assert normalize_destination("topic://x") == "/topic/x"
    assert normalize_destination("/temp-queue/x") == "/temp-queue/x"
    with pytest.raises(AmqSparkOptionError):
        normalize_destination("  ")


def test_keys() -> None:
    assert batch_key("run", 3, 17) == "run-p3-r17"
    assert stream_key("q-uuid", 5, 1, 0) == "q-uuid-b5-p1-r0"
    assert column_key(42) == "42" and column_key("k", "pre") == "pre-k" and column_key(b"ab") == "ab"
    a, b = new_run_id(), new_run_id()
    assert a != b and a.startswith("spark-")
    for bad in (None, "", "a\nb"):
        with pytest.raises(ValueError):
            column_key(bad)


_keys = st.text(st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, st.text(st.characters(codec="utf-8"), max_size=30), max_size=8))
def test_fuzz_writer_options_only_raise_the_option_error(opts: dict[str, str]) -> None:
    opts = {"uri": URI, "destination": "q", **opts}
    try:
        o = parse_writer_options(opts)
    except AmqSparkOptionError as exc:
        assert str(exc).startswith("amq")
    else:
        assert o.receipt_window >= 1 and o.destination is not None and o.destination.startswith("/")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["uri", "destination", "walpath", "maxbatchsize", "numpartitions",
                                        "receivetimeout", "prefetch", "path", "login", "bogus"]),
                       st.text(st.characters(codec="utf-8"), max_size=12), max_size=9))
def test_fuzz_reader_options_only_raise_the_option_error(opts: dict[str, str]) -> None:
    try:
        o = parse_reader_options(opts)
    except AmqSparkOptionError as exc:
        assert str(exc).startswith("amq")
    else:
        assert o.destination.startswith("/queue/") and o.max_batch_size >= 1 and o.num_partitions >= 1
