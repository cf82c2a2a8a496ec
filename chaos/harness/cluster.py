"""What a chaos run (a scenario, the nemesis) runs against: brokers (a "cluster") behind
Toxiproxy proxies (a "stage").

Theory of operation
-------------------
A :class:`Cluster` is a set of broker nodes whose client ports never change (a killed
node comes back on the same port), so one proxy per node can stay in front of it for
the whole run:

* :class:`EmbeddedPairCluster` — our :class:`~amqtransport.processes.pair.BrokerPair`
  in ``replicated`` or ``shared-store`` mode; ``kill_master`` SIGKILLs the master's
  process and the slave takes over; ``recover`` starts the killed node again (it comes
  back as the slave) before the next round.
* :class:`SingleNodeCluster` — one :class:`~amqtransport.processes.broker.BrokerProcess`;
  ``kill_master`` SIGKILLs it and restarts it at once on the same port and data
  directory (there is no slave). It exercises the same client failover path and is
  the fallback when no pair is available (``--mode single``).
* :class:`ActiveMQCluster` — a real ActiveMQ Classic shared-store pair
  (:class:`~amqtransport.processes.activemq.ActiveMQPair`).

A :class:`Stage` puts a Toxiproxy proxy in front of every node, created through the
PyPI ``toxiproxy-python`` client against our :class:`chaos.proxy.server.ToxiproxyServer`
exactly as a user would drive it, and builds the clients' ``failover:`` URI whose
leaves are the proxies' listen addresses. A cluster whose nodes relay clients to their
master on a port of their own (``relay_upstreams``: our pair run with ``--relay-port``)
gets one more proxy per relay port, listed *after* the client proxies, so a client
reaches the master directly when it can and a slave's relay only as a last resort.
Faults act on the *master's* client proxy (or its process).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.proxy import Proxy

from amqtransport.errors import AmqTransportError
from amqtransport.processes.broker import BrokerProcess
from amqtransport.processes.ports import free_port
from chaos.proxy.server import ToxiproxyServer

__all__ = [
    "Cluster",
    "ClusterError",
    "SingleNodeCluster",
    "EmbeddedPairCluster",
    "ActiveMQCluster",
    "BridgeCluster",
    "Stage",
    "make_cluster",
    "start_bridge",
    "EMBEDDED_MODES",
    "ALL_KINDS",
]

log = logging.getLogger(__name__)

EMBEDDED_MODES = ("replicated", "shared-store", "single")
ALL_KINDS = (*EMBEDDED_MODES, "activemq")


def _nothing() -> None:
    return None


class ClusterError(AmqTransportError, RuntimeError):
    """A cluster could not be started or brought back to health."""


class Cluster(Protocol):
    kind: str
    names: list[str]
    login: str | None
    passcode: str | None

    def upstreams(self) -> list[str]:
        """``host:port`` of every node's client port, in a fixed order."""
        ...

    def master_index(self, timeout: float = 30.0) -> int:
        """Index of the node serving clients now (waits for one)."""
        ...

    def kill_master(self, mark: Callable[[], None] = _nothing) -> str:
        """SIGKILL the master's process (calling ``mark()`` just before the signal);
        return a short description."""
        ...

    def recover(self, timeout: float = 60.0) -> None:
        """Restart whatever was killed and wait until the cluster is whole again."""
        ...

    def close(self) -> None: ...


def _wait_port(host: str, port: int, timeout: float) -> bool:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class SingleNodeCluster:
    """One broker process, SIGKILLed and restarted in place (see the module docstring)."""

    kind = "single"

    def __init__(self, workdir: Path) -> None:
        self.names = ["node0"]
        self.login: str | None = None
        self.passcode: str | None = None
        self.proc = BrokerProcess(workdir / "node0", port=free_port(), log_dir=workdir / "logs")
        self.proc.start()

    def upstreams(self) -> list[str]:
        return [f"{self.proc.host}:{self.proc.port}"]

    def master_index(self, timeout: float = 30.0) -> int:
        if not self.proc.alive:
            raise ClusterError("the broker process is not running\n" + self.proc.log_text()[-2000:])
        return 0

    def kill_master(self, mark: Callable[[], None] = _nothing) -> str:
        pid = self.proc.pid
        mark()
        self.proc.kill()
        self.proc.start()
        return f"SIGKILL node0 (pid {pid}), restarted as pid {self.proc.pid}"

    def recover(self, timeout: float = 60.0) -> None:
        if not self.proc.alive:
            self.proc.start()

    def close(self) -> None:
        self.proc.terminate()


class EmbeddedPairCluster:
    """Our HA pair (``BrokerPair``) in ``replicated`` or ``shared-store`` mode."""

    def __init__(self, workdir: Path, mode: str, *, pair_options: Mapping[str, Any] | None = None,
                 before_start: Callable[[Any], None] | None = None) -> None:
        """``pair_options``: more ``BrokerPair`` keyword arguments; ``before_start(pair)``
        runs once the pair's ports and directories are chosen, before any node starts
        (e.g. to put a proxy on a port the slave's master connector names)."""
        try:
            from amqtransport.processes.pair import BrokerPair
        except ImportError as exc:  # the pair is a separate piece of work
            raise ClusterError(
                f"the embedded HA pair (amqtransport.processes.pair) is not available: {exc}; "
                "use --mode single"
            ) from exc
        self.kind = mode
        self.login: str | None = None
        self.passcode: str | None = None
        self.pair: Any = BrokerPair(mode=mode, data_dir=workdir / f"pair-{mode}", **dict(pair_options or {}))
        try:
            if before_start is not None:
                before_start(self.pair)
            self.pair.start()
        except BaseException as exc:
            self.pair.stop()
            raise ClusterError(f"the {mode} pair did not start: {exc}") from exc
        self.names: list[str] = [f"node-{n.name}" for n in self.pair.nodes]
        self._killed: list[Any] = []

    def upstreams(self) -> list[str]:
        return [f"{n.host}:{n.port}" for n in self.pair.nodes]

    def relay_upstreams(self) -> list[str]:
        """``host:port`` of every node's relay port (nodes run with ``--relay-port``)."""
        return [f"{n.host}:{n.relay_port}" for n in self.pair.nodes if n.relay_port is not None]

    def master_index(self, timeout: float = 30.0) -> int:
        master = self.pair.wait_master(timeout=timeout)
        return list(self.pair.nodes).index(master)

    def kill_master(self, mark: Callable[[], None] = _nothing) -> str:
        index = self.master_index()
        node = self.pair.nodes[index]
        pid = node.pid
        mark()
        node.kill()
        self._killed.append(node)
        return f"SIGKILL {self.names[index]} (pid {pid})"

    def recover(self, timeout: float = 60.0) -> None:
        """Restart the killed node(s): each comes back as the slave of the survivor."""
        self.pair.wait_master(timeout=timeout)
        while self._killed:
            node = self._killed.pop()
            try:
                self.pair.restart(node, timeout=timeout)
                if self.kind == "replicated":
                    self.pair.wait_in_sync(timeout=timeout)
                else:
                    node.wait_line("role slave", timeout)
            except Exception as exc:
                raise ClusterError(f"{node.name} did not come back as slave: {exc}") from exc

    def close(self) -> None:
        self.pair.stop()


class ActiveMQCluster:
    """A real ActiveMQ Classic 5.17 shared-store pair (no send dedupe on the broker)."""

    kind = "activemq"

    def __init__(self, workdir: Path) -> None:
        from amqtransport.processes.activemq import ActiveMQPair, missing_reason

        reason = missing_reason()
        if reason is not None:
            raise ClusterError(f"ActiveMQ is not available: {reason}")
        self.login: str | None = None
        self.passcode: str | None = None
        self.pair = ActiveMQPair(workdir / "activemq")
        try:
            self.pair.start()
        except BaseException:
            self.pair.kill()
            raise
        self.names = [n.name for n in self.pair.nodes]

    def upstreams(self) -> list[str]:
        return [f"{n.host}:{n.stomp_port}" for n in self.pair.nodes]

    def master_index(self, timeout: float = 30.0) -> int:
        master = self.pair.wait_master(timeout=timeout)
        return list(self.pair.nodes).index(master)

    def kill_master(self, mark: Callable[[], None] = _nothing) -> str:
        node = self.pair.wait_master()
        pid = node.pid
        mark()
        node.kill()
        return f"SIGKILL {node.name} (pid {pid})"

    def recover(self, timeout: float = 60.0) -> None:
        from amqtransport.processes.activemq import SLAVE_WAITING

        master = self.pair.wait_master(timeout=timeout)
        for node in self.pair.nodes:
            if node is not master and not node.alive:
                node.start(wait=False)
                node.wait_for_log(SLAVE_WAITING, timeout=timeout)

    def close(self) -> None:
        self.pair.stop()


class BridgeCluster:
    """A spoke broker bridged to a hub pair (``bridge`` topology).

    The hub is an :class:`EmbeddedPairCluster` (its nodes are the ones behind the
    proxies and the ones faults act on); the spoke is one broker process the producer
    sends to directly (``producer_uri``). Once the stage exists, :meth:`attach` starts
    a :class:`bridge.agent.BridgeAgent` in this process with one network connector
    whose remote URI is ``masterslave:`` over the hub's *proxies*, forwarding one
    queue (``destination``) from the spoke to the hub, where the consumer reads
    (through the same proxies).
    """

    def __init__(self, workdir: Path, mode: str) -> None:
        self.hub = EmbeddedPairCluster(workdir / "hub", mode)
        self.kind = mode
        self.names = self.hub.names
        self.login: str | None = None
        self.passcode: str | None = None
        self.agent: Any = None
        try:
            self.spoke = BrokerProcess(workdir / "spoke", port=free_port(), log_dir=workdir / "logs")
            self.spoke.start()
        except BaseException:
            self.hub.close()
            raise
        # our broker has no wildcard queue subscriptions: one fixed forwarded queue (the
        # bodies carry the round, so a straggler from an earlier round is "foreign")
        self.destination = "/queue/chaos.bridged"
        self.producer_uri: str | None = (
            f"failover:({self.spoke.uri})?initialReconnectDelay=20&maxReconnectDelay=500"
        )

    def attach(self, stage: Stage) -> None:
        self.agent = start_bridge(self.spoke.uri, stage, [self.destination])

    def upstreams(self) -> list[str]:
        return self.hub.upstreams()

    def master_index(self, timeout: float = 30.0) -> int:
        return self.hub.master_index(timeout)

    def kill_master(self, mark: Callable[[], None] = _nothing) -> str:
        return "hub " + self.hub.kill_master(mark)

    def recover(self, timeout: float = 60.0) -> None:
        self.hub.recover(timeout)

    def close(self) -> None:
        try:
            if self.agent is not None:
                self.agent.stop()
        finally:
            try:
                self.spoke.terminate()
            finally:
                self.hub.close()


def start_bridge(spoke_uri: str, stage: Stage, destinations: list[str]) -> Any:
    """A :class:`bridge.agent.BridgeAgent` in this process forwarding ``destinations``
    from the spoke broker at ``spoke_uri`` to the pair behind ``stage``'s proxies
    (``masterslave:`` over the proxies, so faults on them hit the bridge too)."""
    from bridge.agent import BridgeAgent
    from bridge.config import config_from_mapping

    leaves = ",".join(f"tcp://{p.listen}" for p in stage.leaves)
    config = config_from_mapping({
        "local_uri": spoke_uri,
        "status_listen": "",
        "broker_name": "spoke",
        "network_connector": [{
            "name": "spoke-to-hub",
            "uri": f"masterslave:({leaves})?initialReconnectDelay=100&maxReconnectDelay=1000",
            "static_include": list(destinations),
            "heartbeat_ms": 1000,
            "remote_name": "hub",
        }],
    })
    return BridgeAgent(config).start()


def make_cluster(kind: str, workdir: Path, topology: str = "broker") -> Cluster:
    if topology == "bridge":
        if kind not in ("replicated", "shared-store"):
            raise ValueError(f"the bridge topology needs a pair mode, got {kind!r}")
        return BridgeCluster(workdir, kind)
    if kind == "single":
        return SingleNodeCluster(workdir)
    if kind in ("replicated", "shared-store"):
        return EmbeddedPairCluster(workdir, kind)
    if kind == "activemq":
        return ActiveMQCluster(workdir)
    raise ValueError(f"unknown cluster kind {kind!r}; expected one of {', '.join(ALL_KINDS)}")


class Stage:
    """A Toxiproxy server with one proxy per cluster node, driven by ``toxiproxy-python``."""

    def __init__(self, cluster: Cluster, *, prefix: str = "chaos", server: ToxiproxyServer | None = None) -> None:
        """``server``: a running Toxiproxy server to use (the stage stops it on close);
        default: a new one on a free port."""
        self.cluster = cluster
        self.active: dict[str, Any] = {}  # what the current fault changed (for its heal)
        self.server = server if server is not None else ToxiproxyServer(port=0).start()
        try:
            self.toxi = Toxiproxy()
            self.toxi.update_api_consumer("127.0.0.1", self.server.port)
            # a cut (disable) closes a proxy's listener and the heal binds the same port
            # again: a port-0 (ephemeral) port could meanwhile be taken by any connection
            # or server on the machine; free_port is below that range and reserved for us
            self.proxies: list[Proxy] = [
                self.toxi.create(upstream=upstream, name=f"{prefix}-{name}", listen=f"127.0.0.1:{free_port()}")
                for name, upstream in zip(cluster.names, cluster.upstreams(), strict=True)
            ]
            relays = getattr(cluster, "relay_upstreams", None)
            #: in front of the nodes' relay ports (after the client proxies in the URI); no fault acts on them
            self.relay_proxies: list[Proxy] = [
                self.toxi.create(upstream=upstream, name=f"{prefix}-{name}-relay", listen=f"127.0.0.1:{free_port()}")
                for name, upstream in zip(cluster.names, relays() if relays is not None else [], strict=False)
            ]
            attach = getattr(cluster, "attach", None)
            if attach is not None:  # e.g. a bridge whose remote side goes through the proxies
                attach(self)
        except BaseException:
            self.server.stop()
            raise

    def _point_client(self) -> None:
        # toxiproxy-python keeps its API address in a class attribute: re-point it in
        # case another stage (or a test) moved it meanwhile.
        APIConsumer.host, APIConsumer.port = "127.0.0.1", self.server.port

    def uri(self, *, timeout_ms: int = -1, max_reconnect_delay_ms: int = 500) -> str:
        """The clients' failover URI over the proxies (first node first, no shuffling;
        the relay proxies after the client proxies)."""
        leaves = ",".join(f"tcp://{p.listen}" for p in self.leaves)
        return (
            f"failover:({leaves})?randomize=false&initialReconnectDelay=20"
            f"&maxReconnectDelay={max_reconnect_delay_ms}&timeout={timeout_ms}"
        )

    @property
    def leaves(self) -> list[Proxy]:
        """Every proxy a client lists, in its URI's order: the client proxies, then the relay proxies."""
        return [*self.proxies, *self.relay_proxies]

    def master_proxy(self, timeout: float = 30.0) -> Proxy:
        self._point_client()
        return self.proxies[self.cluster.master_index(timeout)]

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (Toxiproxy's ``POST /reset``)."""
        self._point_client()
        self.active.clear()
        self.toxi.reset()

    def add_toxic(self, proxy: Proxy, type: str, stream: str, attributes: dict[str, Any],
                  name: str | None = None) -> str:
        self._point_client()
        name = name or f"{type}_{stream}"
        proxy.add_toxic(type=type, stream=stream, name=name, toxicity=1.0, attributes=attributes)
        return name

    def mark_fault(self) -> None:
        """Record now as the instant the current fault took effect."""
        self.active["t_fault"] = time.monotonic()

    def disable(self, proxy: Proxy) -> None:
        self._point_client()
        proxy.disable()

    def enable(self, proxy: Proxy) -> None:
        self._point_client()
        proxy.enable()

    def remove_toxic(self, proxy: Proxy, name: str) -> None:
        self._point_client()
        proxy.destroy_toxic(name)

    def remove_toxics(self, proxy: Proxy) -> None:
        self._point_client()
        for name in list(proxy.toxics()):
            proxy.destroy_toxic(name)

    def close(self) -> None:
        try:
            self._point_client()
            for proxy in self.leaves:
                proxy.destroy()
        except Exception:  # the server goes away next anyway
            log.debug("destroying proxies failed", exc_info=True)
        finally:
            self.server.stop()

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def scratch_dir(base: str | Path | None = None) -> Path:
    return Path(tempfile.mkdtemp(prefix="amq-chaos-", dir=base))
