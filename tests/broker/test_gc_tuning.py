"""A broker process collects garbage less often than Python's default (issue 22: the
collector took a quarter of the broker's CPU in a selective drain of a deep queue)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from amqtransport.processes.broker import BrokerProcess


def test_amq_broker_run_raises_the_young_generation_threshold_and_freezes_startup_objects(tmp_path: Path) -> None:
    bp = BrokerProcess(tmp_path / "d", log_dir=tmp_path).start()
    try:
        log = bp.log_text()
    finally:
        bp.terminate()
    assert "garbage collector: young generation every 50000 allocations (was 700)" in log, log


def test_tune_gc_sets_the_threshold_and_keeps_the_older_generations() -> None:
    code = ("import gc; from amqtransport.cli.broker_cmd import tune_gc; before = gc.get_threshold(); tune_gc(); "
            "after = gc.get_threshold(); print(before[1:] == after[1:], after[0], gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["True", "50000", "True"], out
