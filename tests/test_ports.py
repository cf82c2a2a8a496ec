"""processes/ports.py: ports for servers that cannot bind port 0, safe from other processes.

The nemesis kills a node and restarts it on the same port seconds later; a test broker
of a suite running at the same time must not get that port meanwhile (shared-store
round 126 of a 200-round run failed that way). Port-0 binds cannot take it (it is below
the ephemeral range); another process's ``free_port`` cannot either (its reservation).
"""

from __future__ import annotations

import subprocess
import sys

from amqtransport.processes.ports import ephemeral_range, free_port, reserve_port

_CHILD = (
    "import sys\n"
    "from amqtransport.processes.ports import free_port\n"
    "print(free_port(), flush=True)\n"
    "sys.stdin.read()\n"  # hold the reservation until the test closes our stdin
)


def test_free_port_is_never_one_a_port_zero_bind_could_get() -> None:
    lo, hi = ephemeral_range()
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert not [p for p in ports if lo <= p <= hi], (ports, (lo, hi))


def test_a_port_handed_out_to_a_live_process_is_reserved_until_it_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        # the port is not bound by anyone yet (a node between kill and restart): still not ours
        assert not reserve_port(port), f"port {port} of a live process was reserved again"
        child.stdin.close()
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert reserve_port(port), f"port {port} stayed reserved after its process exited"


def test_reserving_twice_in_one_process_is_allowed() -> None:
    port = free_port()
    assert reserve_port(port)
