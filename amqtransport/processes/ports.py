"""Free TCP ports for test servers that cannot bind port 0 themselves.

Most of our servers bind port 0 and report the port; a few cannot (ActiveMQ needs the
port written into its XML before it starts, a shared-store slave binds its port only
when it takes over, possibly much later). For those, :func:`free_port` hands out a
port that is free *now* and, to make a later collision unlikely:

- it picks ports **below** the kernel's ephemeral range (``ip_local_port_range``), so
  neither outgoing connections nor other servers' port-0 binds can take it meanwhile;
- it never hands out the same port twice in one process;
- it never hands out a port that another *live* process of this user got from it
  (:func:`reserve_port`: an ``flock`` on ``<tmp>/amqtransport-ports-<uid>/<port>``, held
  until the process exits). A port chosen once and bound again and again -- a node
  killed and restarted by the nemesis, a shared-store slave that binds on takeover --
  therefore stays out of the hands of every other suite, benchmark or nemesis running
  on the machine meanwhile (their port-0 binds cannot take it either: it is below
  the ephemeral range);
- it checks the port binds on the host and nothing listens there.

There is still a window between the check and the real bind (a program that does not
use this module could pick the same number), so callers that own the bind should retry
on "address in use". A process keeps at most :data:`MAX_RESERVED` reservations (one
open file each); beyond that its oldest ones are given back.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

__all__ = ["free_port", "ephemeral_range", "reserve_port", "MAX_RESERVED"]

_lock = threading.Lock()
_handed_out: set[int] = set()
_rng = random.SystemRandom()
#: reservations one process holds at most (one open file each); the oldest go first
MAX_RESERVED = 256
_reserved: OrderedDict[int, int] = OrderedDict()  # port -> fd of its locked reservation file

_LOW = 20000  # start of the range we pick from (below the usual 32768 ephemeral start)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux), or the IANA default elsewhere."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        lo, hi = (int(x) for x in text.split())
        return lo, hi
    except (OSError, ValueError):
        return 49152, 65535


def _reservations() -> Path:
    path = Path(tempfile.gettempdir()) / f"amqtransport-ports-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def reserve_port(port: int) -> bool:
    """Reserve ``port`` for this process, machine-wide among the processes of this user
    that use this module: False if another live process holds it. The reservation (an
    exclusive ``flock`` on a file named after the port) lasts until this process exits,
    or until it holds more than :data:`MAX_RESERVED` and this one is the oldest."""
    with _lock:
        if port in _reserved:
            return True
        fd = os.open(_reservations() / str(port), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        _reserved[port] = fd
        while len(_reserved) > MAX_RESERVED:
            os.close(_reserved.popitem(last=False)[1])  # closing the file releases its lock
        return True


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
    """Return a TCP port on ``host`` that is free now and not in the ephemeral range,
    reserved for this process (:func:`reserve_port`).

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
    for _ in range(200):
        port = _rng.randrange(bottom, top)
        with _lock:
            if port in _handed_out:
                continue
            _handed_out.add(port)  # tried once: taken, or never handed out twice
        if reserve_port(port) and _bindable(port, host):
            return port
    raise RuntimeError(f"free_port: no free port found in {bottom}..{top - 1} on {host}")
