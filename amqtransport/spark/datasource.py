"""``AmqDataSource``: the PySpark 4 Python data source registered as format ``amq``.

    from amqtransport.spark import AmqDataSource
    spark.dataSource.register(AmqDataSource)
    (df.write.format("amq").mode("append")
       .option("uri", "failover:(tcp://a:61613,tcp://b:61613)?randomize=false")
       .option("destination", "/queue/orders").save())

Options are validated here, on the driver, before any task runs (see
:mod:`amqtransport.spark.options`); writers live in :mod:`.writer`, the queue reader in
:mod:`.reader`.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from amqtransport.spark.options import (
    AmqSparkOptionError,
    parse_reader_options,
    parse_writer_options,
    reject_overwrite,
)
from amqtransport.spark.reader import READER_SCHEMA, AmqStreamReader
from amqtransport.spark.writer import AmqBatchWriter, AmqStreamWriter

__all__ = ["AmqDataSource"]


class AmqDataSource(DataSource):
    """Format ``amq``: batch and streaming writers to STOMP destinations, a streaming queue reader."""

    @classmethod
    def name(cls) -> str:
        return "amq"

    def schema(self) -> str:
        return READER_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        reject_overwrite(overwrite)
        return AmqBatchWriter(parse_writer_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        reject_overwrite(overwrite)
        return AmqStreamWriter(parse_writer_options(self.options), schema)

    def streamReader(self, schema: StructType) -> AmqStreamReader:  # noqa: N802
        return AmqStreamReader(parse_reader_options(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        raise AmqSparkOptionError(
            "amq: batch reads are not supported (a queue has no snapshot to read); use "
            "spark.readStream.format(\"amq\") (at-least-once, acks after each micro-batch commits)"
        )
