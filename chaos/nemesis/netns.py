"""Real network partitions: the pair's nodes in Linux network namespaces, links cut by the kernel.

Theory of operation
-------------------
**Topology.** Every :class:`Endpoint` is a place packets come from: the pair's nodes
``a`` and ``b`` each live in a network namespace of their own, and ``clients`` is the
namespace this process runs in (the workload, the probes, the proxies, the spoke, the
nemesis itself). A private *switch* namespace holds a Linux bridge; each endpoint has
a veth pair with one end in its namespace (its address in a private ``10.x.y.0/24``)
and the other end on the bridge. Nothing is routed: the subnet exists only on those
veths, so no packet leaves the machine, and deleting the namespaces deletes every veth
(the root end of ``clients``' veth goes with its peer in the switch namespace).
Servers bind their endpoint's address (``--host 10.x.y.N``); a third endpoint (the
witness) is one more :class:`Endpoint` in :func:`plan_endpoints`'s list.

**Links and cuts (the pure part).** A cut is *directed*: ``(src, dst)`` drops the
packets ``src`` sends to ``dst`` (a partition is both directions, an asymmetric cut
one; *isolating* a node cuts it from every other endpoint both ways). :func:`nft_script`
turns the set of active cuts into one nftables script per namespace: a cut is placed in
``src``'s ``output`` chain when ``src`` has a namespace of ours, else in ``dst``'s
``input`` chain, so this process's own namespace never gets a rule. A cut between a
node and ``clients`` covers only the node's *client port* (``tcp dport``/``sport``), and
its relay port if it has one (``--relay-port``: a client reaches the node there too): the
nemesis's own look at the nodes (the HA status on the HA port) keeps working through a
client partition, which is what a client partition is. Between two nodes everything is
cut, or (service ``ha``) only the connections to either node's HA port: the
replication link, while each still sees the other answer on its client port. A cut's action is ``drop`` (packets vanish: nothing closes, heart-beats must
notice) or ``reject`` (a TCP reset: the peer sees the link die at once).

**Applying (the I/O part).** :class:`Netns` creates the namespaces and veths, one nft
table ``inet amq_nemesis`` per node namespace, and on every change replaces the
chains' rules atomically (``flush chain`` + rules in one ``nft -f``). :meth:`Netns.close`
deletes everything it created (idempotent; the nemesis calls it on exit and on
Ctrl-C); :func:`sweep_stale` deletes the namespaces a killed earlier run left behind
(names carry the creating pid). :func:`unavailable_reason` tries the real thing once
(a namespace, a veth pair, an nft table) and says why it cannot be done here.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from amqtransport.errors import AmqTransportError

__all__ = ["Endpoint", "Netns", "NetnsError", "CLIENTS", "TABLE", "ACTIONS", "SERVICES", "plan_endpoints", "nft_script", "partition",
           "one_way", "isolate", "unavailable_reason", "sweep_stale", "NS_PREFIX"]

CLIENTS = "clients"
TABLE = "amq_nemesis"
ACTIONS = ("drop", "reject")
NS_PREFIX = "amqnem"

#: (from, to, service): the packets ``from`` sends ``to`` on ``service`` ("all", or "ha":
#: only the HA ports' connections, the replication link) vanish
Cut = tuple[str, str, str]
SERVICES = ("all", "ha")


@dataclass(frozen=True)
class Endpoint:
    name: str
    ip: str
    ns: str | None  # None: this process's own namespace
    client_port: int | None = None  # the port a cut to/from ``clients`` covers
    ha_port: int | None = None  # the port an "ha" cut between two nodes covers
    relay_port: int | None = None  # --relay-port: a cut to/from ``clients`` covers it too

    @property
    def ours(self) -> bool:
        return self.ns is not None


def plan_endpoints(tag: str, subnet: str, nodes: Sequence[str], ports: Mapping[str, int],
                   ha_ports: Mapping[str, int] | None = None,
                   relay_ports: Mapping[str, int] | None = None) -> dict[str, Endpoint]:
    """``clients`` at ``subnet.1`` (our namespace), then each node in its own namespace
    ``<tag>-<name>`` at ``subnet.2``, ``.3``... (a witness: one more name in ``nodes``)."""
    out = {CLIENTS: Endpoint(CLIENTS, f"{subnet}.1", None)}
    for i, name in enumerate(nodes, start=2):
        out[name] = Endpoint(name, f"{subnet}.{i}", f"{tag}-{name}", ports.get(name), (ha_ports or {}).get(name),
                             (relay_ports or {}).get(name))
    return out


def partition(x: str, y: str, service: str = "all") -> set[Cut]:
    """``x`` and ``y`` cannot reach each other (on ``service``)."""
    return {(x, y, service), (y, x, service)}


def one_way(src: str, dst: str, service: str = "all") -> set[Cut]:
    """``src``'s packets to ``dst`` vanish; ``dst``'s to ``src`` still arrive."""
    return {(src, dst, service)}


def isolate(x: str, endpoints: Iterable[str]) -> set[Cut]:
    """``x`` cut from every other endpoint, both ways."""
    return {c for other in endpoints if other != x for c in partition(x, other)}


def _rules(src: Endpoint, dst: Endpoint, service: str, action: str) -> tuple[str, list[str]]:
    """(namespace, rules) for the directed cut ``src -> dst`` (see the module docstring)."""
    if action not in ACTIONS:
        raise ValueError(f"a cut's action is one of {', '.join(ACTIONS)}, not {action!r}")
    if service not in SERVICES:
        raise ValueError(f"a cut's service is one of {', '.join(SERVICES)}, not {service!r}")
    verdict = "drop" if action == "drop" else "meta l4proto tcp reject with tcp reset"
    if src.ns is None and dst.ns is None:
        raise ValueError(f"a cut between {src.name} and {dst.name}: neither has a namespace of ours")
    if src.ns is None or dst.ns is None:  # a node and the clients: the node's client port only
        if service != "all":
            raise ValueError(f"a cut between {src.name} and {dst.name} covers the client port; service {service!r}")
        if src.ns is not None:
            return src.ns, [f"add rule inet {TABLE} output ip daddr {dst.ip} tcp sport {_client_ports(src)} {verdict}"]
    if dst.ns is not None and src.ns is None:
        return dst.ns, [f"add rule inet {TABLE} input ip saddr {src.ip} tcp dport {_client_ports(dst)} {verdict}"]
    assert src.ns is not None
    out = f"add rule inet {TABLE} output ip daddr {dst.ip}"
    if service == "all":
        return src.ns, [f"{out} {verdict}"]
    # "ha": src's connections to dst's HA port, and src's answers on its own HA port
    return src.ns, [f"{out} tcp dport {_port(dst, 'ha')} {verdict}", f"{out} tcp sport {_port(src, 'ha')} {verdict}"]


def _client_ports(e: Endpoint) -> str:
    """The ports a cut between ``e`` and the clients covers: its client port, and its relay port if any."""
    port = _port(e, "client")
    return str(port) if e.relay_port is None else f"{{ {port}, {e.relay_port} }}"


def _port(e: Endpoint, which: str) -> int:
    port = e.client_port if which == "client" else e.ha_port
    if port is None:
        raise ValueError(f"endpoint {e.name} has no {which} port: that link cannot be cut")
    return port


def nft_script(cuts: Mapping[Cut, str], endpoints: Mapping[str, Endpoint]) -> dict[str, str]:
    """One nft script per namespace of ours: both chains flushed, then a rule per cut
    (``cuts``: directed cut -> action). Every namespace gets a script, so healing the
    last cut of a namespace empties its chains."""
    rules: dict[str, list[str]] = {e.ns: [] for e in endpoints.values() if e.ns is not None}
    for (src, dst, service), action in sorted(cuts.items()):
        if src == dst:
            raise ValueError(f"a cut from {src} to itself")
        unknown = [n for n in (src, dst) if n not in endpoints]
        if unknown:
            raise ValueError(f"unknown endpoint(s) {', '.join(unknown)}; known: {', '.join(endpoints)}")
        ns, rs = _rules(endpoints[src], endpoints[dst], service, action)
        rules[ns].extend(rs)
    return {ns: "\n".join([f"flush chain inet {TABLE} input", f"flush chain inet {TABLE} output", *rs]) + "\n"
            for ns, rs in rules.items()}


# -- I/O ---------------------------------------------------------------------------------


class NetnsError(AmqTransportError, RuntimeError):
    """A network namespace, link or nft rule could not be made or removed (the command's output says why)."""


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), input=stdin, capture_output=True, text=True, check=False, timeout=30)


def _must(*args: str, stdin: str | None = None) -> None:
    done = _run(*args, stdin=stdin)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(args)} failed: {done.stderr.strip() or done.returncode}")


TABLE_SETUP = (f"add table inet {TABLE}\n"
               f"add chain inet {TABLE} input {{ type filter hook input priority 0; policy accept; }}\n"
               f"add chain inet {TABLE} output {{ type filter hook output priority 0; policy accept; }}\n")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _our_namespaces() -> list[str]:
    done = _run("ip", "netns", "list")
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(NS_PREFIX)]


def sweep_stale() -> list[str]:
    """Delete namespaces ``amqnem<pid>...`` whose creating process is gone; their names."""
    gone = []
    for ns in _our_namespaces():
        digits = ns[len(NS_PREFIX):].split("x", 1)[0]
        if digits.isdigit() and not _pid_alive(int(digits)):
            _run("ip", "netns", "del", ns)
            gone.append(ns)
    return gone


def unavailable_reason() -> str | None:
    """None when namespaces, veths and nftables work here; else why not."""
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no {tool} command (scripts/setup.sh installs nftables)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    net = Netns(["probe"], {"probe": 1})
    try:
        net.start()
    except NetnsError as exc:
        return f"cannot build a network namespace with a veth and an nft table here: {exc}"
    finally:
        net.close()
    return None


class Netns:
    """The namespaces, veths and nft tables of one run (see the module docstring)."""

    def __init__(self, nodes: Sequence[str], ports: Mapping[str, int], ha_ports: Mapping[str, int] | None = None,
                 rng: random.Random | None = None, relay_ports: Mapping[str, int] | None = None) -> None:
        rng = rng or random.Random()
        self.tag = f"{NS_PREFIX}{os.getpid()}x{rng.randrange(16**4):04x}"
        self.subnet = self._subnet(rng)
        self.endpoints = plan_endpoints(self.tag, self.subnet, nodes, ports, ha_ports, relay_ports)
        self.switch = f"{self.tag}-sw"
        self.cuts: dict[Cut, str] = {}  # active cut -> action
        self.refs: dict[Cut, int] = {}  # active cut -> how many faults hold it
        self.created: list[str] = []  # namespaces, in creation order
        self.root_link: str | None = None

    @staticmethod
    def _subnet(rng: random.Random) -> str:
        used = _run("ip", "-4", "addr").stdout + _run("ip", "-4", "route").stdout
        for _ in range(100):
            net = f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 256)}"
            if f"{net}." not in used:
                return net
        raise NetnsError("no free 10.x.y.0/24 subnet found")

    def start(self) -> Netns:
        try:
            self._add_ns(self.switch)
            _must("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _must("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, e in enumerate(self.endpoints.values()):
                inner, outer = f"{self.tag[-4:]}{i}i{os.getpid() % 1000}", f"{self.tag[-4:]}{i}o{os.getpid() % 1000}"
                _must("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
                if e.ns is None:
                    self.root_link = inner
                else:
                    self._add_ns(e.ns)
                    _must("ip", "link", "set", inner, "netns", e.ns)
                _must("ip", "link", "set", outer, "netns", self.switch)
                _must("ip", "-n", self.switch, "link", "set", outer, "master", "br0", "up")
                ns_args = ["-n", e.ns] if e.ns else []
                _must("ip", *ns_args, "addr", "add", f"{e.ip}/24", "dev", inner)
                _must("ip", *ns_args, "link", "set", inner, "up")
                if e.ns is not None:
                    _must("ip", "-n", e.ns, "link", "set", "lo", "up")
                    _must("ip", "netns", "exec", e.ns, "nft", "-f", "-", stdin=TABLE_SETUP)
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _must("ip", "netns", "add", name)
        self.created.append(name)

    def exec_prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program in endpoint ``name``'s namespace."""
        ns = self.endpoints[name].ns
        return [] if ns is None else ["ip", "netns", "exec", ns]

    def ip(self, name: str) -> str:
        return self.endpoints[name].ip

    def cut(self, cuts: Iterable[Cut], action: str = "drop") -> list[Cut]:
        """Cut these links (held until as many :meth:`heal` as cuts of each: two
        concurrent faults may cut the same link); the cuts, for :meth:`heal`."""
        held = sorted(set(cuts))
        saved = (dict(self.cuts), dict(self.refs))
        for c in held:
            self.cuts[c] = action
            self.refs[c] = self.refs.get(c, 0) + 1
        try:
            self.apply()
        except BaseException:
            self.cuts, self.refs = saved
            raise
        return held

    def heal(self, cuts: Iterable[Cut]) -> None:
        for c in cuts:
            self.refs[c] = self.refs.get(c, 1) - 1
            if self.refs[c] <= 0:
                self.refs.pop(c, None)
                self.cuts.pop(c, None)
        self.apply()

    def heal_all(self) -> None:
        self.cuts.clear()
        self.refs.clear()
        self.apply()

    def apply(self) -> None:
        for ns, script in nft_script(self.cuts, self.endpoints).items():
            if ns in self.created:
                _must("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=script)

    def ruleset(self, name: str) -> str:
        ns = self.endpoints[name].ns
        return _run("ip", "netns", "exec", ns, "nft", "list", "table", "inet", TABLE).stdout if ns else ""

    def close(self) -> None:
        """Delete every namespace created (their veths and rules go with them); idempotent."""
        for ns in reversed(self.created):
            _run("ip", "netns", "del", ns)
        self.created.clear()
        self.refs.clear()
        if self.root_link is not None:
            _run("ip", "link", "del", self.root_link)  # gone with its peer already, normally
            self.root_link = None
        self.cuts.clear()
