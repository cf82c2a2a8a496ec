"""Who answers clients: a STOMP probe of each node's client port every 50 ms.

Theory of operation
-------------------
One thread per node (so a frozen node, whose kernel still accepts the TCP connection
but never answers, cannot delay the other node's probes). Each tick it connects
*directly* to the node's client port (not through the proxies: a client-link fault
must not hide a serving node), sends ``CONNECT`` and waits up to ``timeout`` for the
first frame: ``CONNECTED`` means the node answers clients -- unless its ``session``
header names another node (a broker's session ids start with its ``--name``): that
answer was relayed to the master, and the master's own probe counts it. (A slave run
with ``--relay-port`` relays on that port only, never on the client port probed here;
the check keeps any relayed answer, wherever it came from, out of the two-masters rule.) A probe's interval runs
from just before the connect to the arrival of the answer (the close comes after).

Results are folded into runs of consecutive identical answers
(:class:`~chaos.nemesis.history.ProbeRun`: the first and the last probe's start and
end, and the count), appended to the history when the answer flips and at
:meth:`Prober.stop`: the checker's ``two-masters`` rule needs nothing finer.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from chaos.nemesis.history import History, ProbeRun

__all__ = ["probe_once", "Prober"]

CONNECT = b"CONNECT\naccept-version:1.2\nhost:nemesis-probe\nheart-beat:0,0\n\n\x00"


def probe_once(host: str, port: int, timeout: float, clock: Callable[[], float] = time.monotonic, *,
               node: str | None = None) -> tuple[bool, float]:
    """(True when a STOMP CONNECT on ``host:port`` is answered with CONNECTED in time --
    by the broker named ``node``, when given: a CONNECTED whose session id names another
    one was relayed --, ``clock()`` when the answer -- or the refusal, EOF or timeout -- came)."""
    deadline = time.monotonic() + timeout
    sock: socket.socket | None = None
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.sendall(CONNECT)
        data = b""
        while b"\x00" not in data and len(data) < 4096:
            left = deadline - time.monotonic()
            if left <= 0:
                return False, clock()
            sock.settimeout(left)
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return _connected_by(data, node), clock()
    except OSError:
        return False, clock()
    finally:
        if sock is not None:
            sock.close()


def _connected_by(data: bytes, node: str | None) -> bool:
    """``data`` is a CONNECTED frame, from the broker named ``node`` (if given)."""
    head = data.lstrip(b"\r\n").split(b"\x00", 1)[0]
    if not head.startswith(b"CONNECTED"):
        return False
    if node is None:
        return True
    for line in head.split(b"\n\n", 1)[0].split(b"\n")[1:]:
        key, _sep, value = line.rstrip(b"\r").partition(b":")
        if key == b"session":
            return value.startswith(node.encode() + b"-")
    return True


class Prober:
    """Probes every ``(name, host, port)`` every ``interval`` seconds until stopped."""

    def __init__(self, nodes: list[tuple[str, str, int]], history: History, clock: Callable[[], float], *,
                 interval: float = 0.05, timeout: float = 0.25) -> None:
        self.nodes = nodes
        self.history = history
        self.clock = clock
        self.interval = interval
        self.timeout = timeout
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=node, name=f"nemesis probe {node[0]}", daemon=True)
                         for node in nodes]
        self.answered: dict[str, bool] = {}  # the latest answer per node

    def start(self) -> Prober:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _loop(self, name: str, host: str, port: int) -> None:
        run: list[float] | None = None  # [first_t0, first_t1, last_t0, last_t1, count]
        state: bool | None = None
        next_at = self.clock()
        while not self._stop.is_set():
            t0 = self.clock()
            answered, t1 = probe_once(host, port, self.timeout, self.clock, node=name)
            self.answered[name] = answered
            if run is not None and answered == state:
                run[2], run[3], run[4] = t0, t1, run[4] + 1
            else:
                if run is not None and state is not None:
                    self.history.add(ProbeRun(name, state, run[0], run[1], run[2], run[3], int(run[4])))
                run, state = [t0, t1, t0, t1, 1], answered
            next_at += self.interval
            delay = next_at - self.clock()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = self.clock()
        if run is not None and state is not None:
            self.history.add(ProbeRun(name, state, run[0], run[1], run[2], run[3], int(run[4])))
