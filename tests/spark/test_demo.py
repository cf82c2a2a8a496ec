"""``amq demo`` (the README's first command), small: the replicated pair loses its master mid-job."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def test_demo_survives_a_master_kill(spark: Any) -> None:
    from amqtransport.cli.demo_cmd import run_demo

    r = run_demo(rows=6000, partitions=4, kill_at=0.3, window=50, quiet=True, spark=spark)
    assert r.killed.startswith("SIGKILL master"), r  # the kill really happened mid-job
    assert r.job_error is None, r.job_error
    assert (r.receipted, r.consumed, r.distinct, r.duplicates, r.lost) == (6000, 6000, 6000, 0, 0)
    assert r.recovery_seconds is not None and r.recovery_seconds > 0
    assert r.ok


def test_demo_command_is_registered() -> None:
    from amqtransport.cli.main import cli

    out = CliRunner().invoke(cli, ["demo", "--help"])
    assert out.exit_code == 0 and "--kill-at" in out.output and "--cluster" in out.output
