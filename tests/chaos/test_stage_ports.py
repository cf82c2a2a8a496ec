"""The chaos stage's proxies listen where a healed cut can bind again.

A cut (``disable``) closes a proxy's listener and the heal binds the same address again.
On a port-0 (ephemeral) port, any outgoing connection or port-0 server on the machine
could take that port during the cut, and the heal would fail with "address already in
use"; so the stage's proxies listen on :func:`~amqtransport.processes.ports.free_port`
ports (below the ephemeral range, reserved for this process).
"""

from __future__ import annotations

from collections.abc import Callable

from amqtransport.processes.ports import ephemeral_range, reserve_port
from chaos.harness.cluster import Stage


class _Unstarted:
    """A cluster of two nodes that are never started (the stage only reads names and upstreams)."""

    kind = "replicated"
    names = ["a", "b"]
    login: str | None = None
    passcode: str | None = None

    def upstreams(self) -> list[str]:
        return ["127.0.0.1:9", "127.0.0.1:9"]

    def master_index(self, timeout: float = 30.0) -> int:
        return 0

    def kill_master(self, mark: Callable[[], None] = lambda: None) -> str:
        return "nothing"

    def recover(self, timeout: float = 60.0) -> None:
        return None

    def close(self) -> None:
        return None


def test_stage_proxies_listen_outside_the_ephemeral_range_and_keep_their_port() -> None:
    stage = Stage(_Unstarted(), prefix="portcheck")
    try:
        lo, hi = ephemeral_range()
        before = [p.listen for p in stage.proxies]
        ports = [int(listen.rsplit(":", 1)[1]) for listen in before]
        assert not [p for p in ports if lo <= p <= hi], (ports, (lo, hi))
        for port in ports:
            assert reserve_port(port)  # ours: reserved by this process, no other can get it
        proxy = stage.proxies[0]
        stage.disable(proxy)
        stage.enable(proxy)
        assert [p.listen for p in stage.toxi.proxies().values()].count(before[0]) == 1
    finally:
        stage.close()
