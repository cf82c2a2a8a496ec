"""Carrying out a round's plan on the real pair: inject, heal, restart, check health.

Theory of operation
-------------------
A :class:`~chaos.nemesis.schedule.Step` names a role ("the master"); :meth:`Nemesis.inject`
resolves it *now* (the node whose HA status says ``master`` and ``listening``, never a
node we froze), does the fault and returns an :class:`Active` fault whose ``heal``
undoes it (SIGCONT, enable the proxy, remove the step's own toxics, delete the ballast
file); instant faults (SIGKILL, restart, deleting the lock file) have nothing to heal.
Every fault becomes a ``Fault`` record (``t`` to ``t_end``, target node, detail) once it
has ended. A step whose target does not exist at that moment (no master during a
takeover, no dead node) is skipped and recorded as such.

Kernel faults (:mod:`chaos.nemesis.netns`): ``partition-*`` and ``isolate-node``
resolve the roles to the nodes' network endpoints (``clients`` is this process's
namespace; ``witness`` the witness's, when the pair has one: ``partition-witness``
cuts it from the master or the slave, and an isolated node is cut from it too), add the cuts and heal exactly those (a link two faults cut stays cut until
both healed). ``cut-replication`` is a kernel cut too when the nodes run in namespaces
(``disable``: a TCP reset both ways, ``half-open``: a silent drop), of the connections
to the HA ports only: the nodes still see each other answer on their client ports. ``power-loss``
freezes the LazyFS (:mod:`chaos.nemesis.lazyfs`), SIGKILLs the node whose data is on it
and drops every unsynced write (tearing the newest with ``tear=1``); the node stays
down until ``restart-dead``. ``bit-flip`` stops the slave cleanly, flips one bit of one
journal record that is not the last (:mod:`chaos.nemesis.bitflip`, seeded by the
round and the step) and starts it again.

Signals go to the pid of the ``Popen`` we started, and only while that process is
still running: a reaped pid is never signalled. :meth:`Nemesis.heal_all` (end of a
round, Ctrl-C) heals every active fault, :meth:`Nemesis.restart_dead` restarts the
nodes that are down, and :meth:`Nemesis.wait_healthy` waits for one master and one
slave in sync, restarting a node that dies while it waits (replicated: ``amq-ha-peer-state: in-sync`` on the slave; shared store:
the other node waiting for the lock as ``slave``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toxiproxy.proxy import Proxy

from amqtransport.errors import AmqTransportError
from chaos.harness.cluster import Stage
from chaos.nemesis.bitflip import flip_bit
from chaos.nemesis.cluster import WITNESS, NemesisCluster
from chaos.nemesis.history import Fault, History
from chaos.nemesis.netns import CLIENTS, isolate, one_way, partition
from chaos.nemesis.schedule import Step
from chaos.nemesis.workload import InFlightCheck

__all__ = ["Active", "Nemesis"]

log = logging.getLogger(__name__)

#: the fault kinds done by the kernel (skipped when the nodes are not in namespaces)
NET_KINDS = ("partition-replication", "partition-clients", "partition-one-way", "isolate-node", "partition-witness")

Clock = Callable[[], float]


@dataclass
class Active:
    step: Step
    round: int
    t: float
    target: str
    detail: str
    heal: Callable[[], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    def __init__(self, cluster: NemesisCluster, stage: Stage, history: History, clock: Clock) -> None:
        self.cluster = cluster
        self.stage = stage
        self.history = history
        self.clock = clock
        self.active: list[Active] = []
        self.frozen: dict[str, Any] = {}  # node name -> the Popen we stopped
        self.skipped: list[str] = []
        #: makes the freeze-in-flight fault's check (set by the runner once the workload runs)
        self.in_flight: Callable[[str], InFlightCheck] | None = None
        self.background: list[InFlightCheck] = []  # freeze-in-flight checks still running

    @property
    def nodes(self) -> tuple[Any, ...]:
        return tuple(self.cluster.pair.nodes)

    def index_of(self, node: Any) -> int:
        return list(self.nodes).index(node)

    # -- roles ---------------------------------------------------------------------------
    def master(self, timeout: float = 5.0) -> Any | None:
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes:
                if node.alive and node.name not in self.frozen:
                    st = node.status(timeout=0.5)
                    if st.get("amq-ha-role") == "master" and st.get("amq-ha-listening") == "true":
                        return node
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def dead(self) -> list[Any]:
        return [n for n in self.nodes if not n.alive]

    # -- faults --------------------------------------------------------------------------
    def inject(self, step: Step, round_no: int) -> Active | None:
        try:
            active = self._inject(step, round_no)
        except Exception as exc:  # a fault that could not be done is recorded, not fatal
            log.exception("fault %s failed", step.kind)
            active = Active(step, round_no, self.clock(), "-", f"failed: {exc!r}")
        if active is None:
            return None
        if active.heal is None:
            self._record(active)
            return None
        self.active.append(active)
        return active

    def _skip(self, step: Step, round_no: int, why: str) -> None:
        t = self.clock()
        self.skipped.append(f"round {round_no} {step.kind}: {why}")
        self.history.add(Fault(t, t, round_no, step.kind, "-", f"skipped: {why}"))

    def _record(self, a: Active) -> None:
        self.history.add(Fault(a.t, self.clock(), a.round, a.step.kind, a.target, a.detail))

    def heal(self, active: Active) -> None:
        if active in self.active:
            self.active.remove(active)
        try:
            if active.heal is not None:
                active.heal()
        except Exception as exc:
            log.exception("healing %s failed", active.step.kind)
            active.detail += f"; heal failed: {exc!r}"
        self._record(active)

    def heal_all(self) -> None:
        for a in list(self.active):
            self.heal(a)
        self.thaw_all()

    def thaw_all(self) -> None:
        for name, proc in list(self.frozen.items()):
            self._signal(proc, signal.SIGCONT)
            self.frozen.pop(name, None)

    @staticmethod
    def _signal(proc: Any, sig: int) -> bool:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)
            return True
        return False

    def _inject(self, step: Step, round_no: int) -> Active | None:
        kind = step.kind
        t = self.clock()
        if kind == "restart-dead":
            dead = self.dead()
            if not dead:
                self._skip(step, round_no, "no node is down")
                return None
            node = dead[0]
            node.start(timeout=30)
            return Active(step, round_no, t, node.name, f"restarted as pid {node.pid}")
        if kind == "delete-lock":
            lock = Path(self.cluster.pair.a.data_dir) / "ha.lock"
            existed = lock.exists()
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            return Active(step, round_no, t, "store", f"deleted {lock}" if existed else f"{lock} was not there")
        if kind == "bit-flip":
            return self._bit_flip(step, round_no)
        master = self.master()
        if master is None:
            self._skip(step, round_no, "no serving master at that moment")
            return None
        t = self.clock()
        if kind in NET_KINDS:
            return self._partition(step, round_no, master)
        if kind == "power-loss":
            return self._power_loss(step, round_no, master)
        if kind == "cut-replication" and self.cluster.net is not None:
            return self._partition(step, round_no, master)
        if kind == "kill-master":
            pid = master.pid
            master.kill()
            return Active(step, round_no, t, master.name, f"SIGKILL pid {pid}")
        if kind == "kill-slave":
            others = [n for n in self.nodes if n is not master and n.alive]
            if not others:
                self._skip(step, round_no, "no live slave")
                return None
            pid = others[0].pid
            others[0].kill()
            return Active(step, round_no, t, others[0].name, f"SIGKILL pid {pid}")
        if kind == "freeze-master":
            return self._freeze(step, round_no, master)
        if kind == "freeze-in-flight":
            return self._freeze_in_flight(step, round_no, master)
        if kind == "disk-full":
            return self._disk_full(step, round_no, master)
        if kind == "cut-replication":
            proxy = self.cluster.repl_proxies.get(master.name)
            if proxy is None:
                self._skip(step, round_no, "no replication proxy (shared store)")
                return None
            return self._cut(step, round_no, master, proxy, str(step.params.get("variant", "disable")))
        proxy = self.stage.proxies[self.index_of(master)]
        if kind == "cut-client":
            return self._cut(step, round_no, master, proxy, "disable")
        if kind == "half-open-client":
            return self._cut(step, round_no, master, proxy, "half-open")
        if kind == "latency":
            where = str(step.params.get("where", "client"))
            if where == "replication":
                if master.name not in self.cluster.repl_proxies:
                    self._skip(step, round_no, "no replication proxy (the nodes are in network namespaces)")
                    return None
                proxy = self.cluster.repl_proxies[master.name]
            ms = int(step.params.get("ms", 300))
            attrs = {"latency": ms, "jitter": ms // 10}
            names = self._toxics(proxy, step, [("latency", "downstream", attrs), ("latency", "upstream", attrs)])
            return Active(step, round_no, self.clock(), master.name, f"{proxy.name}: latency {ms} ms",
                          heal=lambda: self._remove(proxy, names))
        raise ValueError(f"unknown fault kind {kind!r}")

    def _other(self, node: Any) -> Any:
        return next(n for n in self.nodes if n is not node)

    def _partition(self, step: Step, round_no: int, master: Any) -> Active | None:
        net = self.cluster.net
        if net is None:
            self._skip(step, round_no, f"no network namespaces ({self.cluster.net_reason})")
            return None
        slave = self._other(master)
        roles = {"master": master.name, "slave": slave.name, "clients": CLIENTS}
        kind, action = step.kind, "drop"
        if kind == "partition-replication":
            cuts = partition(master.name, slave.name)
        elif kind == "cut-replication":  # the HA ports only: each node still sees the other's client port
            cuts = partition(master.name, slave.name, "ha")
            if step.params.get("variant") == "disable":
                action = "reject"
        elif kind == "partition-clients":
            cuts = partition(master.name, CLIENTS)
        elif kind == "partition-witness":
            if WITNESS not in net.endpoints:
                self._skip(step, round_no, f"no witness ({self.cluster.witness_reason})")
                return None
            cuts = partition(roles[str(step.params.get("node", "master"))], WITNESS)
        elif kind == "partition-one-way":
            src, dst = str(step.params.get("dir", "master->slave")).split("->")
            cuts = one_way(roles[src], roles[dst])
        else:  # isolate-node
            cuts = isolate(roles[str(step.params.get("node", "master"))], net.endpoints)
        held = net.cut(cuts, action)
        what = ", ".join(f"{a}->{b}" + ("" if svc == "all" else f" ({svc} ports)") for a, b, svc in held)
        target = slave.name if step.params.get("node") == "slave" else master.name
        return Active(step, round_no, self.clock(), target, f"kernel {action}: {what} (master {master.name})",
                      heal=lambda: net.heal(held))

    def _power_loss(self, step: Step, round_no: int, master: Any) -> Active | None:
        fs = self.cluster.lazy
        node = self.cluster.lazy_node(master)
        if fs is None or node is None:
            self._skip(step, round_no, f"no LazyFS ({self.cluster.lazy_reason})")
            return None
        if not node.alive or node.name in self.frozen:
            self._skip(step, round_no, f"node {node.name} is not running")
            return None
        role = "master" if node is master else "slave"
        t, pid = self.clock(), node.pid
        try:
            what = fs.power_loss(pid, tear=bool(step.params.get("tear", 0)))
        finally:
            node.kill()  # reaps it
        return Active(step, round_no, t, node.name, f"power loss of the {role}: SIGKILL pid {pid}; {what}")

    def _bit_flip(self, step: Step, round_no: int) -> Active | None:
        master = self.master()
        slave = None if master is None else self._other(master)
        if slave is None or not slave.alive or slave.name in self.frozen:
            self._skip(step, round_no, "no master with a running slave")
            return None
        t = self.clock()
        slave.terminate()
        try:
            flip = flip_bit(Path(slave.data_dir), random.Random(f"bit-flip:{round_no}:{step.at}"))
        finally:
            slave.start(timeout=30)
        if flip is None:
            self._skip(step, round_no, f"no journal record to damage on node {slave.name} (it was stopped "
                       "and started again, nothing flipped)")
            return None
        return Active(step, round_no, t, slave.name, f"stopped; {flip.describe()}; restarted as pid {slave.pid}")

    def _freeze(self, step: Step, round_no: int, node: Any) -> Active:
        proc = node.proc
        self._signal(proc, signal.SIGSTOP)
        self.frozen[node.name] = proc
        t = self.clock()

        def thaw() -> None:
            self.frozen.pop(node.name, None)
            self._signal(proc, signal.SIGCONT)

        return Active(step, round_no, t, node.name, f"SIGSTOP pid {proc.pid} for {step.hold:.1f}s", heal=thaw)

    def _freeze_in_flight(self, step: Step, round_no: int, node: Any) -> Active:
        """A freeze with a durable SUBSCRIBE (a new subscription) and a trackMessages idle
        barrier written into the frozen master's sockets: the thawed master must receipt
        neither when it was replaced meanwhile (issue 23, defect 1)."""
        if self.in_flight is None:
            return self._freeze(step, round_no, node)
        check = self.in_flight(f"fresh-r{round_no}-{step.at:g}")
        try:
            check.connect()  # to the master, before it is frozen
        except AmqTransportError as exc:  # e.g. its client link is cut right now
            active = self._freeze(step, round_no, node)
            active.detail += f"; nothing in flight (its clients could not connect: {exc})"
            return active
        active = self._freeze(step, round_no, node)
        check.start()
        self.background.append(check)
        active.detail += f"; in flight: a durable SUBSCRIBE to {check.topic}, tracked sends and their barrier"
        return active

    def join_background(self, timeout: float) -> None:
        """Wait for the freeze-in-flight checks to finish (their deliveries are history)."""
        deadline = time.monotonic() + timeout
        for check in self.background:
            check.join(max(0.0, deadline - time.monotonic()))
        self.background = [c for c in self.background if c.is_alive()]

    def _disk_full(self, step: Step, round_no: int, node: Any) -> Active | None:
        mount = self.cluster.mount_of(node)
        if mount is None:
            self._skip(step, round_no, f"no tmpfs data directory ({self.cluster.disk_reason})")
            return None
        t = self.clock()
        written = mount.fill()
        return Active(step, round_no, t, node.name, f"{mount.path} filled ({written // 1024} KiB ballast)",
                      heal=mount.drain)

    def _toxics(self, proxy: Proxy, step: Step, specs: list[tuple[str, str, dict[str, int]]]) -> list[str]:
        tag = f"{step.kind}-{step.at:g}"
        return [self.stage.add_toxic(proxy, kind, stream, attrs, name=f"{tag}-{stream}") for kind, stream, attrs in specs]

    def _remove(self, proxy: Proxy, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(Exception):  # a reset may have removed it already
                self.stage.remove_toxic(proxy, name)

    def _cut(self, step: Step, round_no: int, node: Any, proxy: Proxy, variant: str) -> Active:
        if variant == "disable":
            self.stage.disable(proxy)
            return Active(step, round_no, self.clock(), node.name, f"{proxy.name} disabled",
                          heal=lambda: self.stage.enable(proxy))
        names = self._toxics(proxy, step, [("timeout", "downstream", {"timeout": 0}),
                                           ("timeout", "upstream", {"timeout": 0})])
        return Active(step, round_no, self.clock(), node.name, f"{proxy.name} half-open",
                      heal=lambda: self._remove(proxy, names))

    # -- between rounds ------------------------------------------------------------------
    def restart_dead(self) -> list[str]:
        """Start every node that is down (never one we froze: a stopped process is alive);
        the names of those started. A node that will not start (its data filesystem still
        full, a port still held) is logged and left down: the next call tries again."""
        out = []
        for node in self.dead():
            try:
                node.start(timeout=30)
            except Exception:
                log.exception("restarting node %s failed", node.name)
                continue
            out.append(node.name)
        return out

    def health(self) -> tuple[bool, str]:
        """(one master and one slave in sync, a description of both nodes)."""
        sts = {n.name: (n.status(timeout=0.5) if n.alive and n.name not in self.frozen else {}) for n in self.nodes}
        masters = [n for n, st in sts.items() if st.get("amq-ha-role") == "master" and st.get("amq-ha-listening") == "true"]
        desc = "; ".join(
            f"{n}: {st.get('amq-ha-role', 'down')} epoch {st.get('amq-ha-epoch', '-')}"
            + (f" peer {st['amq-ha-peer-state']}" if "amq-ha-peer-state" in st else "")
            for n, st in sts.items()
        )
        if len(masters) != 1:
            return False, desc
        other = next(st for n, st in sts.items() if n != masters[0])
        if other.get("amq-ha-role") != "slave":
            return False, desc
        if self.cluster.kind == "replicated" and other.get("amq-ha-peer-state") != "in-sync":
            return False, desc
        return True, desc

    def wait_healthy(self, timeout: float, restarted: list[str] | None = None) -> tuple[bool, float, str]:
        """Wait (up to ``timeout``) for one master and one slave in sync: (healthy, how
        long, description). A node found down meanwhile is started again (its name
        appended to ``restarted``): a node that fences itself late (a full disk noticed
        at its next write, a takeover it lost) dies *during* the wait, after the round's
        own restart, and must not leave the pair unhealthy for the rest of the round."""
        t0 = time.monotonic()
        ok, desc = self.health()
        while not ok and time.monotonic() - t0 < timeout:
            again = self.restart_dead()
            if restarted is not None:
                restarted.extend(again)
            time.sleep(0.1)
            ok, desc = self.health()
        return ok, time.monotonic() - t0, desc
