"""One SparkSession for every Spark test (session-scoped; stopped at the end).

``local[2,3]``: two cores and up to 3 attempts per task, so retries can be tested.
Workers run this interpreter (``PYSPARK_PYTHON``) so they see the editable install.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pyspark = pytest.importorskip("pyspark", reason="the spark extra (pyspark>=4) is not installed")
    pytest.importorskip("pyarrow", reason="pyarrow is required by Python data sources")
    if int(pyspark.__version__.split(".")[0]) < 4:
        pytest.skip(f"pyspark {pyspark.__version__} has no Python data source API (needs >= 4)")
    from pyspark.sql import SparkSession

    from amqtransport.spark import AmqDataSource

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("amqtransport-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.faulthandler.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(AmqDataSource)
    try:
        yield session
    finally:
        session.stop()
