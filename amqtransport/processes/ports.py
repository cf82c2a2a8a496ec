"""Free TCP ports for test servers that cannot bind port 0 themselves.

Most of our servers bind port 0 and report the port; a few cannot (ActiveMQ needs the
port written into its XML before it starts, a shared-store slave binds its port only
when it takes over, possibly much later). For those, :func:`free_port` hands out a
port that is free *now* and, to make a later collision unlikely:

- it picks ports **below** the kernel's ephemeral range (``ip_local_port_range``), so
  neither outgoing connections nor other servers' port-0 binds can take it meanwhile;
- it never hands out the same port twice in one process;
- it checks the port binds on the host and nothing listens there.

There is still a window between the check and the real bind (another process could
pick the same number), so callers that own the bind should retry on "address in use".
"""

from __future__ import annotations

import errno
import random
import socket
import threading
from pathlib import Path

__all__ = ["free_port", "ephemeral_range"]

_lock = threading.Lock()
_handed_out: set[int] = set()
_rng = random.SystemRandom()

_LOW = 20000  # start of the range we pick from (below the usual 32768 ephemeral start)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux), or the IANA default elsewhere."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        lo, hi = (int(x) for x in text.split())
        return lo, hi
    except (OSError, ValueError):
        return 49152, 65535


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    # a listener on 0.0.0.0 with SO_REUSEADDR tricks may still let us bind; make sure
    # nothing answers there either
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        try:
            s.connect((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free now and not in the ephemeral range.

    Thread-safe; never returns the same port twice within one process.
    """
    lo, hi = ephemeral_range()
    if lo - _LOW >= 2000:
        bottom, top = _LOW, lo
    else:  # the ephemeral range starts low: pick above it instead
        bottom, top = max(hi + 1, 1024), 65536
    if bottom >= top:  # a strange range configuration: fall back to the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    with _lock:
        for _ in range(200):
            port = _rng.randrange(bottom, top)
            if port in _handed_out:
                continue
            if _bindable(port, host):
                _handed_out.add(port)
                return port
    raise RuntimeError(f"free_port: no free port found in {bottom}..{top - 1} on {host}")
