"""Bad options and schemas fail on the driver with a clear error, before any task runs."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark

URI = "failover:(tcp://127.0.0.1:9)?maxReconnectAttempts=0"


def _df(spark: Any, ddl: str = "body string") -> Any:
    return spark.createDataFrame([("a",)], ddl)


def _error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


def test_unknown_option_names_the_valid_ones(spark: Any) -> None:
    with pytest.raises(Exception) as ei:
        _df(spark).write.format("amq").mode("append").option("uri", URI).option("destination", "q").option(
            "receiptWindw", "5"
        ).save()
    text = _error_text(ei)
    assert "unknown option(s) 'receiptwindw'" in text and "receiptWindow" in text and "idPrefix" in text


def test_missing_uri(spark: Any) -> None:
    with pytest.raises(Exception, match="option uri is required"):
        _df(spark).write.format("amq").mode("append").option("destination", "q").save()


def test_overwrite_mode_is_rejected(spark: Any) -> None:
    with pytest.raises(Exception) as ei:
        _df(spark).write.format("amq").mode("overwrite").option("uri", URI).option("destination", "q").save()
    text = _error_text(ei)
    # Spark itself may refuse overwrite for this source before asking us; either way it is clear.
    assert "overwrite mode is not supported" in text or "UNSUPPORTED_DATA_SOURCE_SAVE_MODE" in text


def test_body_column_is_required_and_typed(spark: Any) -> None:
    w = lambda df: df.write.format("amq").mode("append").option("uri", URI).option("destination", "q")  # noqa: E731
    with pytest.raises(Exception, match="needs a column named body"):
        w(spark.createDataFrame([("a",)], "value string")).save()
    with pytest.raises(Exception, match="column body must be string or binary, got int"):
        w(spark.createDataFrame([(1,)], "body int")).save()
    with pytest.raises(Exception, match="unexpected column.*'extra'"):
        w(spark.createDataFrame([("a", 1)], "body string, extra int")).save()
    with pytest.raises(Exception, match="headers must be map<string,string>"):
        w(spark.createDataFrame([("a", "h")], "body string, headers string")).save()


def test_no_destination_anywhere(spark: Any) -> None:
    with pytest.raises(Exception, match="no destination"):
        _df(spark).write.format("amq").mode("append").option("uri", URI).save()


def test_reader_needs_wal_path(spark: Any) -> None:
    query = (
        spark.readStream.format("amq").option("uri", URI).option("destination", "q").load()
        .writeStream.format("noop").start()
    )
    try:
        with pytest.raises(Exception, match="walPath is required"):
            query.processAllAvailable()
    finally:
        query.stop()
