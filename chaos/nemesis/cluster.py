"""What the nemesis runs against: our HA pair with proxies on every link, a spoke broker
bridged to it, and (when allowed) size-limited tmpfs data directories.

Theory of operation
-------------------
:class:`NemesisCluster` is a :class:`~chaos.harness.cluster.Cluster` (so a
:class:`~chaos.harness.cluster.Stage` puts the clients' proxies in front of it, as
for every scenario) built on :class:`~chaos.harness.cluster.EmbeddedPairCluster`:

* **Replication proxies** (replicated mode). The slave's ``--master-connector`` names
  a proxy in front of the master's HA port, so cutting or slowing that proxy acts on
  the replication link. Node ``b`` gets one at the first start (proxy ``repl-a`` ->
  ``a``'s HA port); once ``a`` has been master, ``a`` gets one too (``repl-b`` ->
  ``b``'s HA port) for its restarts, when it comes back as ``b``'s slave. A slave that
  loses the link probes the master's own addresses, finds it alive and re-links
  (directly, around the proxy, if the proxy is still cut): a cut replication link
  therefore means "the master loses its synced slave without a goodbye, the slave
  resyncs", not a lasting partition.
* **tmpfs data directories** (``disk=True``, root only): each node's data directory
  (replicated) or the shared store (shared-store) is a ``mount -t tmpfs -o size=...``
  so the ``disk-full`` fault can fill it with a ballast file and empty it again.
  Where mounting is not allowed, :attr:`disk_reason` says why and the fault is
  skipped. Everything mounted is unmounted by :meth:`close`, after the brokers stop.
* **Network namespaces** (``netns=True``, root with ``ip`` and ``nft``): each node runs
  in a network namespace of its own (``ip netns exec``), bound to its address there
  (:mod:`chaos.nemesis.netns`), so the partition faults cut links with the kernel.
  The slaves' master connectors then name the peer's address directly (no replication
  proxy: ``cut-replication`` is a kernel cut of the HA ports' connections only, so the
  slave still sees the master answer on its client port, as with the proxy). Where namespaces cannot be made,
  :attr:`net_reason` says why, the nodes stay on 127.0.0.1 with the replication
  proxies, and the partition faults are skipped.
* **The witness** (``witness=True``): an ``amq broker witness``
  (:class:`~amqtransport.processes.witness.WitnessProcess`) both nodes are given with
  ``--witness``; with namespaces it runs in one of its own (endpoint ``witness``, one
  more name in :class:`~chaos.nemesis.netns.Netns`'s list), so ``partition-witness``
  and ``isolate-node`` cut its links with the kernel too. A shared store with a witness
  is elected by its lease instead of its lock file (amqtransport/broker/ha/sealed.py).
* **Relaying slaves**: both nodes run with ``--relay-port`` (with a witness or
  without: it is orthogonal), and the stage puts a proxy in front of each relay port,
  listed in the clients' failover URI *after* the client proxies
  (:meth:`~chaos.harness.cluster.Stage.uri`: ``client-a, client-b, relay-a, relay-b``):
  a client reaches the master directly while it can, and a client cut from a live
  master -- a client partition, one direction of it, a cut or half-open client proxy
  (those faults act on the master's client proxy only; a kernel cut between a node and
  the clients covers both its ports) -- falls through to the slave's relay. The probes
  look at the client ports, which a slave never binds; a relayed answer would anyway
  count as the master's (:mod:`chaos.nemesis.probe`).
* **LazyFS** (``lazyfs=True``, root with ``/dev/fuse``, fusepy and libfuse2): node
  ``a``'s data directory (replicated) or the shared store is a
  :mod:`chaos.nemesis.lazyfs` mount over a backing directory (on the tmpfs when there is
  one), for the ``power-loss`` fault; :attr:`lazy_reason` says why not otherwise.
* **The spoke and the bridge**: one more broker process (not faulted) and a
  :class:`bridge.agent.BridgeAgent` in this process forwarding the bridged queue from
  the spoke to the pair over the clients' proxies (started by :meth:`attach`, which
  the stage calls once its proxies exist).

The brokers run with small journal segments (compaction runs often), a dedupe window
of ``dedupe_window_seconds``, no redelivery limit (a message bounced between
failovers must not end in a DLQ the checker does not read) and a small ``page_window``
(a queue keeps 100 persistent messages in memory, the rest paged: the selector
feature's backlog of misses pages within seconds, and any queue that backs up during
a fault pages too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.proxy import Proxy

from amqtransport.processes.broker import BrokerProcess
from amqtransport.processes.disk import TmpfsUnavailable, fill, tmpfs
from amqtransport.processes.ports import free_port
from amqtransport.processes.witness import WitnessProcess
from chaos.harness.cluster import ClusterError, EmbeddedPairCluster, Stage, start_bridge
from chaos.nemesis import lazyfs, netns
from chaos.nemesis.lazyfs import LazyFs
from chaos.nemesis.netns import Netns
from chaos.proxy.server import ToxiproxyServer

__all__ = ["TmpfsMount", "NemesisCluster", "NetnsWitness", "BRIDGED_QUEUE", "BROKER_CONFIG", "WITNESS"]

log = logging.getLogger(__name__)

BRIDGED_QUEUE = "/queue/nemesis.bridged"

#: the pair's broker.toml (see the module docstring)
BROKER_CONFIG: dict[str, Any] = {
    "segment_size": 1024 * 1024,
    "compact_interval_ms": 500,
    "dedupe_window_seconds": 600.0,
    "max_redeliveries": -1,
    "page_window": 100,
}

BALLAST = "nemesis-ballast"
#: the witness's endpoint name in the network namespaces
WITNESS = "witness"


def _toml(values: Mapping[str, Any]) -> str:
    lines = []
    for k, v in values.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, int | float):
            lines.append(f"{k} = {v}")
        else:
            lines.append(f'{k} = "{v}"')
    return "\n".join(lines) + "\n"


class TmpfsMount:
    """A size-limited tmpfs on ``path`` (``amqtransport.processes.disk``), with a ballast
    file to fill it and empty it again."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self._stack = contextlib.ExitStack()
        self.mounted = False

    @staticmethod
    def unavailable_reason() -> str | None:
        if shutil.which("mount") is None:
            return "no mount(8) on this machine"
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return "mounting a tmpfs needs root"
        return None

    def mount(self) -> None:
        """Mount it; raises :class:`~amqtransport.processes.disk.TmpfsUnavailable` with the
        reason when the system refuses."""
        self._stack.enter_context(tmpfs(self.path, self.size_mb << 20))
        self.mounted = True

    def unmount(self) -> None:
        """Unmount (lazily if still busy); idempotent."""
        self._stack.close()
        self.mounted = False

    def fill(self) -> int:
        """Write the ballast file until the filesystem is full; its size."""
        return fill(self.path, BALLAST).stat().st_size

    def drain(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / BALLAST).unlink()


class NetnsWitness(WitnessProcess):
    """A :class:`WitnessProcess` started behind a command prefix (``ip netns exec NS``,
    which execs it: the pid is the witness's own)."""

    def __init__(self, data_dir: Path, port: int, *, host: str = "127.0.0.1") -> None:
        super().__init__(data_dir, port, host=host)
        self.wrap: list[str] = []

    def command(self) -> list[str]:
        return [*self.wrap, *super().command()]


class NemesisCluster:
    """The pair, its replication proxies, tmpfs mounts, the spoke and the bridge."""

    def __init__(self, workdir: Path, mode: str, *, disk: bool = True, disk_mb: int = 64,
                 link_timeout: float = 2.0, broker_config: Mapping[str, Any] | None = None,
                 net: bool = True, lazy: bool = True, witness: bool = False) -> None:
        self.kind = mode
        self.login: str | None = None
        self.passcode: str | None = None
        self.workdir = workdir
        self.server = ToxiproxyServer(port=0).start()
        self.toxi = Toxiproxy()
        self.repl_proxies: dict[str, Proxy] = {}  # node name -> proxy in front of its HA port
        self.mounts: dict[str, TmpfsMount] = {}  # node name (or "store") -> its data filesystem
        self.disk_reason: str | None = None if disk else "disabled (--no-disk)"
        self.net: Netns | None = None
        self.net_reason: str | None = None if net else "disabled"
        self.lazy: LazyFs | None = None
        self.lazy_reason: str | None = None if lazy else "disabled"
        self.witness: NetnsWitness | None = None
        self.witness_reason: str | None = None
        if not witness:
            self.witness_reason = "no witness (run with --witness)"
        self.agent: Any = None
        self.spoke: BrokerProcess | None = None
        self.hub: EmbeddedPairCluster | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "broker.toml"
        cfg.write_text(_toml({**BROKER_CONFIG, **dict(broker_config or {})}))
        options: dict[str, Any] = {"extra_args": ["--config", str(cfg)], "link_timeout": link_timeout,
                                   "relay": True}
        if self.net_reason is None:
            netns.sweep_stale()
            self.net_reason = netns.unavailable_reason()
        if self.lazy_reason is None:
            self.lazy_reason = lazyfs.unavailable_reason()
        listen_a = f"127.0.0.1:{free_port()}"
        if mode == "replicated" and self.net_reason is not None:
            options["master_connector"] = f"tcp://{listen_a}"
        if self.witness_reason is None:
            self.witness = NetnsWitness(workdir / "witness", free_port())
            options["witness"] = self.witness.address  # rewritten to its namespace's address by _netns
        try:
            self.hub = EmbeddedPairCluster(workdir, mode, pair_options=options,
                                           before_start=self._before_start(listen_a, disk, disk_mb))
            pair = self.hub.pair
            if mode == "replicated" and self.net is not None:
                # from now on `a` restarts as b's slave, straight to b's address
                pair.a.args.extend(["--master-connector", f"tcp://{pair.b.host}:{pair.b.ha_port}"])
            elif mode == "replicated":
                listen_b = f"127.0.0.1:{free_port()}"
                self.repl_proxies["b"] = self._proxy("repl-b", f"127.0.0.1:{pair.b.ha_port}", listen_b)
                # from now on `a` restarts as b's slave through this proxy
                pair.a.args.extend(["--master-connector", f"tcp://{listen_b}"])
            self.spoke = BrokerProcess(workdir / "spoke", port=free_port(), log_dir=workdir / "logs",
                                       args=("--config", str(cfg))).start()
        except BaseException:
            self.close()
            raise
        self.names: list[str] = self.hub.names

    def _proxy(self, name: str, upstream: str, listen: str) -> Proxy:
        APIConsumer.host, APIConsumer.port = "127.0.0.1", self.server.port
        return self.toxi.create(upstream=upstream, name=name, listen=listen)

    def _before_start(self, listen_a: str, disk: bool, disk_mb: int) -> Callable[[Any], None]:
        def prepare(pair: Any) -> None:
            if disk:
                self._mount(pair, disk_mb)
            if self.lazy_reason is None:
                self._lazyfs(pair)
            if self.net_reason is None:
                self._netns(pair)
            elif self.kind == "replicated":
                self.repl_proxies["a"] = self._proxy("repl-a", f"127.0.0.1:{pair.a.ha_port}", listen_a)
            if self.witness is not None:
                self.witness.start()

        return prepare

    def _netns(self, pair: Any) -> None:
        names = [n.name for n in pair.nodes]
        ports = {n.name: n.port for n in pair.nodes}
        if self.witness is not None:
            names.append(WITNESS)
            ports[WITNESS] = self.witness.port
        try:
            self.net = Netns(names, ports, {n.name: n.ha_port for n in pair.nodes},
                             relay_ports={n.name: n.relay_port for n in pair.nodes if n.relay_port is not None}).start()
        except (OSError, netns.NetnsError) as exc:
            self.net_reason = str(exc)
            return
        for node in pair.nodes:
            node.host = self.net.ip(node.name)
            node.wrap = self.net.exec_prefix(node.name)
        if self.witness is not None:
            old = self.witness.address
            self.witness.host = self.net.ip(WITNESS)
            self.witness.wrap = self.net.exec_prefix(WITNESS)
            for node in pair.nodes:
                node.args[node.args.index(old)] = self.witness.address
        if self.kind == "replicated":
            args = pair.b.args
            i = args.index("--master-connector")
            args[i + 1] = f"tcp://{pair.a.host}:{pair.a.ha_port}"

    def _lazy_paths(self, pair: Any) -> tuple[Path, Path]:
        """(backing directory, mount point) of the LazyFS: node a's data or the store."""
        target = Path(pair.a.data_dir)
        return self.workdir / f"lazyfs-{'store' if self.kind == 'shared-store' else 'a'}", target

    def _lazyfs(self, pair: Any) -> None:
        backing, target = self._lazy_paths(pair)
        try:
            self.lazy = LazyFs(backing, target, log=self.workdir / "logs" / "lazyfs.log").start()
        except (OSError, TimeoutError) as exc:
            self.lazy_reason = f"LazyFS did not mount: {exc}"
            self.lazy = None

    def _mount(self, pair: Any, disk_mb: int) -> None:
        self.disk_reason = TmpfsMount.unavailable_reason()
        if self.disk_reason is not None:
            return
        targets = {"store": pair.a.data_dir} if self.kind == "shared-store" else {n.name: n.data_dir for n in pair.nodes}
        if self.lazy_reason is None:  # the LazyFS's backing directory is what fills up
            backing, _ = self._lazy_paths(pair)
            targets["store" if self.kind == "shared-store" else "a"] = backing
        try:
            for name, path in targets.items():
                m = TmpfsMount(Path(path), disk_mb)
                m.mount()
                self.mounts[name] = m
        except (OSError, TmpfsUnavailable) as exc:
            self.disk_reason = str(exc)
            self._unmount()

    def _unmount(self) -> None:
        for m in self.mounts.values():
            m.unmount()
        self.mounts.clear()

    # -- the Cluster protocol ---------------------------------------------------------
    @property
    def pair(self) -> Any:
        assert self.hub is not None
        return self.hub.pair

    def lazy_node(self, master: Any | None) -> Any | None:
        """The node a ``power-loss`` hits: replicated, node a (its data is on the
        LazyFS); shared store, the master (the store is)."""
        return self.pair.a if self.kind == "replicated" else master

    def mount_of(self, node: Any) -> TmpfsMount | None:
        return self.mounts.get("store" if self.kind == "shared-store" else node.name)

    def upstreams(self) -> list[str]:
        assert self.hub is not None
        return self.hub.upstreams()

    def relay_upstreams(self) -> list[str]:
        assert self.hub is not None
        return self.hub.relay_upstreams()

    def master_index(self, timeout: float = 30.0) -> int:
        assert self.hub is not None
        return self.hub.master_index(timeout)

    def kill_master(self, mark: Callable[[], None] = lambda: None) -> str:
        assert self.hub is not None
        return self.hub.kill_master(mark)

    def recover(self, timeout: float = 60.0) -> None:
        assert self.hub is not None
        self.hub.recover(timeout)

    def attach(self, stage: Stage) -> None:
        """Called by the stage once the clients' proxies exist: start the bridge."""
        assert self.spoke is not None
        try:
            self.agent = start_bridge(self.spoke.uri, stage, [BRIDGED_QUEUE])
        except Exception as exc:
            raise ClusterError(f"the bridge did not start: {exc}") from exc

    def close(self) -> None:
        """Stop the bridge, the spoke and the pair (by pid), then unmount (LazyFS, tmpfs),
        delete the network namespaces and stop the proxies."""
        try:
            if self.agent is not None:
                with contextlib.suppress(Exception):
                    self.agent.stop()
                self.agent = None
            if self.spoke is not None:
                self.spoke.terminate()
                self.spoke = None
            if self.hub is not None:
                self.hub.close()
            if self.witness is not None:
                self.witness.terminate()
        finally:
            try:
                if self.lazy is not None:
                    self.lazy.stop()
                    self.lazy = None
                self._unmount()
            finally:
                if self.net is not None:
                    self.net.close()
                    self.net = None
                self.server.stop()
