"""Sessions with the ``amq`` source registered: local, on any master, or through Spark Connect.

:func:`job_session` is what the examples, the demo and the benchmarks call, so one job
runs unchanged wherever it is launched:

- ``remote="sc://host:15002"``: a Spark Connect session. The *server's* Python workers
  run the data source, so the server's ``PYSPARK_PYTHON`` needs this library; the client
  needs pyspark's connect extras (``amqtransport[spark-connect]``).
- ``master="spark://..."`` / ``"yarn"`` / ``"local[4]"``: that master.
- neither, under ``spark-submit``: the session spark-submit configured (its
  ``--master``, ``--conf``, ``--archives``); nothing is overridden, ``PYSPARK_PYTHON``
  included.
- neither, run by plain ``python``: :func:`local_session`.

:func:`local_session` sets what the Python data source needs on one machine: workers
run *this* interpreter unless ``PYSPARK_PYTHON`` is already set (the package must be
installed there, not only on ``sys.path``), the driver binds 127.0.0.1, no UI, no
console progress bar, few shuffle partitions, log level ERROR.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["job_session", "local_session", "under_spark_submit"]


def under_spark_submit() -> bool:
    """True in a driver started by ``spark-submit`` (it passes the JVM gateway in the environment)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _register(session: Any) -> Any:
    from amqtransport.spark.datasource import AmqDataSource

    session.dataSource.register(AmqDataSource)
    return session


def local_session(master: str = "local[2,3]", app: str = "amqtransport", **conf: str) -> Any:
    """Build (or get) a local SparkSession and register :class:`AmqDataSource` on it.

    ``local[2,3]``: two cores, up to three attempts per task (plain ``local[N]`` never
    retries a failed task).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

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
    return _register(session)


def job_session(app: str = "amqtransport", *, master: str | None = None, remote: str | None = None,
                **conf: str) -> Any:
    """The session for a job: Spark Connect, a given master, spark-submit's, or local (see above)."""
    if remote and master:
        raise ValueError("give a master or a Spark Connect remote (sc://...), not both")
    if master is None and remote is None and not under_spark_submit():
        return local_session(app=app, **conf)
    if master is not None and master.startswith("local"):
        return local_session(master=master, app=app, **conf)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if remote:
        builder = builder.remote(remote)
    elif master:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return _register(builder.getOrCreate())
