"""Secrets stay secret (issue 23 item 5): no passcode on a command line or in output, a
pair's data private to its user.

`amq broker pair --users ... --master-user repl` with the passcode in
`$AMQ_MASTER_PASSWORD` (or `--master-password-file`): neither the pair's nor its
nodes' `/proc/PID/cmdline` holds it, nor does anything `pair` prints (the "restart it
with:" line after a master kill included); the old `--master-password` still works and
is never printed. The data directory and every directory under it are 0700, every file
0600 (journal segments, ha-state.json, logs, pair.json, the secret files).
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(180)

AMQ = [sys.executable, "-m", "amqtransport"]
SECRET = "repl-pw-7f3a9c"


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _wait(out: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while needle not in (text := out.read_text(errors="replace")):
        assert proc.poll() is None, text
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    return text


def _run_pair(tmp_path: Path, how: str) -> None:
    users = tmp_path / "users.txt"
    users.write_text(f"repl:{SECRET}\napp:app-pw\n")
    data = tmp_path / "amq-pair-data"
    out = tmp_path / "pair.out"
    args = [*AMQ, "broker", "pair", "--port", str(free_port()), "--slave-port", str(free_port()),
            "--data-dir", str(data), "--users", str(users), "--master-user", "repl"]
    env = dict(os.environ)
    if how == "env":
        env["AMQ_MASTER_PASSWORD"] = SECRET
    elif how == "file":
        pw = tmp_path / "repl.pw"
        pw.write_text(SECRET + "\n")
        args += ["--master-password-file", str(pw)]
    else:
        args += ["--master-password", SECRET]
    with open(out, "wb") as fh:
        pair = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    pids: list[int] = []
    try:
        text = _wait(out, "Ctrl-C stops", pair)
        pids = [int(p) for p in re.findall(r"^node \w: role \w+ pid (\d+)", text, re.M)]
        roles = dict(re.findall(r"^node (\w): role (\w+) pid", text, re.M))
        assert roles == {"a": "master", "b": "slave"}, text  # the link authenticated with the passcode
        for pid in pids:
            assert SECRET not in _cmdline(pid), f"node pid {pid}: {_cmdline(pid)}"
        if how != "argv":
            assert SECRET not in _cmdline(pair.pid), _cmdline(pair.pid)
        os.kill(pids[0], signal.SIGKILL)  # the master: `pair` prints its restart line
        text = _wait(out, "restart it with:", pair)
        assert SECRET not in text, text
        for path in [data, *data.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            want = 0o700 if path.is_dir() else 0o600
            assert mode & 0o077 == 0 and mode & want == want, f"{path.relative_to(tmp_path)}: {oct(mode)}"
        journal = [p for p in data.rglob("*") if p.is_file() and "journal" in str(p)]
        assert journal and list(data.rglob("ha-state.json")) and list(data.rglob("*.log")), \
            sorted(str(p.relative_to(data)) for p in data.rglob("*"))
    finally:
        if pair.poll() is None:
            pair.send_signal(signal.SIGINT)
            try:
                pair.wait(40)
            except subprocess.TimeoutExpired:
                pair.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert SECRET not in out.read_text(errors="replace")


@pytest.mark.parametrize("how", ["env", "file", "argv"])
def test_no_passcode_in_ps_or_output_and_private_files(tmp_path: Path, how: str) -> None:
    _run_pair(tmp_path, how)


def test_run_master_password_file_and_bad_input(tmp_path: Path) -> None:
    """`amq broker run --ha` reads --master-password-file; both options, or a missing
    file, are an error naming it (exit 2)."""
    base = [*AMQ, "broker", "run", "--ha", "replicated", "--port", str(free_port()), "--data-dir",
            str(tmp_path / "d"), "--cluster-password", "c" * 32, "--master-user", "u"]
    both = subprocess.run([*base, "--master-password", "x", "--master-password-file", str(tmp_path / "pw")],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    missing = subprocess.run([*base, "--master-password-file", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--master-password-file" in missing.stderr and "nope" in missing.stderr, \
        missing.stderr
