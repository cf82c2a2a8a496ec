"""Child-process plumbing shared by the broker harnesses (BrokerProcess, HaNodeProcess).

Spawn ``command`` with stdout on a pipe (the harness reads its ``listening on`` /
role lines) and stderr into a log file; stop it by pid with SIGKILL (a crash) or
SIGTERM then SIGKILL (a clean stop), always reaping it so no zombie is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["kill_and_reap", "read_log", "spawn_logged", "terminate_and_reap"]


def spawn_logged(
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``command``: stdout piped, stderr to ``log_path``, stdin closed, unbuffered Python."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=new_session,
        )


def read_log(log_path: Path | None) -> str:
    """The log file's text; "" when there is none yet."""
    if log_path is None or not log_path.exists():
        return ""
    return log_path.read_text(encoding="utf-8", errors="replace")


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL (no flush, no cleanup: a crash) if still running, then wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def terminate_and_reap(proc: subprocess.Popen[bytes], timeout: float, kill_wait: float) -> int | None:
    """SIGTERM if still running; SIGKILL after ``timeout`` (then wait ``kill_wait``). The exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(kill_wait)
    return proc.returncode
