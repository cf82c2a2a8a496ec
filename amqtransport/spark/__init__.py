"""PySpark data source ``amq`` (needs the ``spark`` extra: pyspark >= 4 and pyarrow).

    from amqtransport.spark import AmqDataSource
    spark.dataSource.register(AmqDataSource)

``AmqDataSource`` is imported lazily so that ``amqtransport.spark.options`` and
``amqtransport.spark.ids`` (pure) work without pyspark installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AmqDataSource"]


def __getattr__(name: str) -> Any:
    if name == "AmqDataSource":
        from amqtransport.spark.datasource import AmqDataSource

        return AmqDataSource
    raise AttributeError(f"module 'amqtransport.spark' has no attribute {name!r}")
