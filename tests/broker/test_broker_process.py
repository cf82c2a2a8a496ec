"""BrokerProcess's own temporary log directory (amqtransport/processes/broker.py): it goes
when the object is stopped for good, unless the caller gave the directory, a run ended
unexpectedly (then it is kept and named on stderr), or ``AMQ_KEEP_LOGS=1``."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from amqtransport.processes.broker import BrokerProcess


def test_an_owned_log_dir_outlives_restarts_and_goes_when_the_broker_is_stopped_for_good(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data") as bp:
        log_dir = bp.log_dir
        assert log_dir.name.startswith("amq-broker-log-") and not log_dir.is_relative_to(tmp_path)
        bp.kill()  # a crash we cause and a restart: the same object goes on, with its logs
        bp.start()
        assert sorted(p.name for p in log_dir.iterdir()) == ["broker-1.log", "broker-2.log"]
        assert "listening on stomp://" in bp.log_text()
    assert not log_dir.exists()

    bp = BrokerProcess(tmp_path / "data").start()  # stop() is for good too
    log_dir = bp.log_dir
    assert bp.stop() == 0
    assert not log_dir.exists()


def test_a_log_dir_the_caller_gave_is_kept(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with BrokerProcess(tmp_path / "data", log_dir=logs):
        pass
    assert [p.name for p in logs.iterdir()] == ["broker-1.log"]


def test_the_log_dir_of_a_broker_that_died_by_itself_is_kept_and_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bp = BrokerProcess(tmp_path / "data").start()
    try:
        os.kill(bp.pid, signal.SIGKILL)  # not bp.kill(): to the object, a crash
        assert bp.proc is not None
        bp.proc.wait(timeout=30)
        bp.close()
        assert (bp.log_dir / "broker-1.log").is_file()
        err = capsys.readouterr().err
        assert str(bp.log_dir) in err and f"exit code {-signal.SIGKILL}" in err, err
    finally:
        bp.kill()
        shutil.rmtree(bp.log_dir, ignore_errors=True)


def test_the_log_dir_of_a_broker_that_did_not_start_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bp = BrokerProcess(tmp_path / "data", args=["--no-such-option"])
    try:
        with pytest.raises(RuntimeError, match="did not report that it is ready"):
            bp.start()
        bp.close()
        assert "--no-such-option" in (bp.log_dir / "broker-1.log").read_text()
        assert str(bp.log_dir) in capsys.readouterr().err
    finally:
        shutil.rmtree(bp.log_dir, ignore_errors=True)


@pytest.mark.parametrize(("keep", "kept"), [("1", True), ("0", False)])
def test_amq_keep_logs_keeps_the_log_dir(keep: str, kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMQ_KEEP_LOGS", keep)
    bp = BrokerProcess(tmp_path / "data")  # never started: closing it is the same decision
    try:
        bp.close()
        assert bp.log_dir.is_dir() == kept
    finally:
        shutil.rmtree(bp.log_dir, ignore_errors=True)
