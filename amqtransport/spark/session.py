"""A local SparkSession with the ``amq`` source registered (demo, examples, benchmarks).

Sets what the Python data source needs on one machine: workers run *this*
interpreter (``PYSPARK_PYTHON``; the package must be installed there, not only on
``sys.path``), the driver binds 127.0.0.1, no UI, no console progress bar, few shuffle
partitions, log level ERROR. On a cluster build the session as usual and call
``spark.dataSource.register(AmqDataSource)``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_session"]


def local_session(master: str = "local[2,3]", app: str = "amqtransport", **conf: str) -> Any:
    """Build (or get) a local SparkSession and register :class:`AmqDataSource` on it.

    ``local[2,3]``: two cores, up to three attempts per task (plain ``local[N]`` never
    retries a failed task).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from amqtransport.spark.datasource import AmqDataSource

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(AmqDataSource)
    return session
