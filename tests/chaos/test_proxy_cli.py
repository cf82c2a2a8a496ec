"""``amq chaos proxy`` runs in the foreground, announces its URL, logs changes, and
stops cleanly on SIGTERM and on Ctrl-C (SIGINT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from amqtransport.cli.chaos_cmd import chaos

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def start_cli() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "amqtransport", "chaos", "proxy", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    prefix = "toxiproxy-compatible API on "
    if not line.startswith(prefix):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"unexpected first line {line!r}; stderr: {err}")
    return proc, line[len(prefix) :].strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_logs_and_stops_on_signal(sig: signal.Signals) -> None:
    proc, url = start_cli()
    try:
        assert url.startswith("http://127.0.0.1:")
        assert requests.get(f"{url}/version", timeout=5).json() == {"version": "2.12.0"}
        created = requests.post(
            f"{url}/proxies", json={"name": "cli", "upstream": "127.0.0.1:9"}, timeout=5
        )
        assert created.status_code == 201
        requests.post(f"{url}/proxies/cli/toxics", json={"type": "latency"}, timeout=5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert "proxy cli created" in err
        assert "toxic latency_downstream added" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def test_cli_help_lists_proxy() -> None:
    result = CliRunner().invoke(chaos, ["--help"])
    assert result.exit_code == 0 and "proxy" in result.output
    result = CliRunner().invoke(chaos, ["proxy", "--help"])
    assert "--host" in result.output and "--port" in result.output


def test_cli_port_in_use_is_a_clear_error() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(chaos, ["proxy", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
