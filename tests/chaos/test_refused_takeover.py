"""A pair without a witness never takes a refusal of a moment for a dead master.

The nemesis found it (``--seed 137316137371860``, a lone ``cut-replication`` with TCP
resets on the HA ports): the master lost its slave and found every address of the
slave refusing (a slave has no client port, its HA port was reset by the cut), so it
receipted alone; the slave found the master's HA port reset and its client port closed
-- a master whose synced slave is lost closes it while it decides, 14 ms that time --
and took over: two masters. Here the same observation is made deterministic with the
kernel (the nodes in network namespaces, :mod:`chaos.nemesis.netns`): the HA ports
reset each other's connections both ways, and the slave's connections to the master's
client port are reset too until the slave says it looks again -- the master's client
port "closed for a moment". The slave must probe again after the confirmation delay,
find the master answering on its client port, and stay slave; the pair comes back
whole once the cut heals.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from amqtransport.processes.pair import BrokerPair, HaNodeProcess
from chaos.nemesis import netns
from chaos.nemesis.netns import TABLE, Netns, partition

NET_REASON = netns.unavailable_reason()

CONFIRMING = "probing its addresses again"  # the slave's log: link-lost row 7 (confirm)
ANSWERS_AGAIN = "the master answers again"  # the slave's log: link-lost row 8 (relink)


def _wait(what: str, cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _took_over(node: HaNodeProcess) -> bool:
    return any(line.startswith("role master") for line in node.lines)


def _apply(net: Netns, first: str, extra: dict[str, str]) -> None:
    """The active cuts plus ``extra`` rules (namespace -> rule), namespace ``first``
    first, each namespace's rules replaced atomically (one ``nft -f``)."""
    scripts = netns.nft_script(net.cuts, net.endpoints)
    for ns in sorted(scripts, key=lambda n: n != first):
        script = scripts[ns] + (extra[ns] + "\n" if ns in extra else "")
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, check=True,
                       capture_output=True)


@pytest.mark.skipif(NET_REASON is not None, reason=f"network namespaces: {NET_REASON}")
@pytest.mark.timeout(240)
def test_a_slave_does_not_take_over_from_a_master_whose_ports_refuse_for_a_moment(tmp_path: Path) -> None:
    pair = BrokerPair("replicated", tmp_path / "pair", link_timeout=2.0, lock_interval=0.2)
    net = Netns(["a", "b"], {n.name: n.port for n in pair.nodes}, {n.name: n.ha_port for n in pair.nodes}).start()
    try:
        for node in pair.nodes:
            node.host = net.ip(node.name)
            node.wrap = net.exec_prefix(node.name)
        args = pair.b.args
        args[args.index("--master-connector") + 1] = f"tcp://{pair.a.host}:{pair.a.ha_port}"
        with pair:
            pair.start()
            master, slave = pair.a, pair.b
            assert pair.wait_in_sync() is slave
            slave_ns = net.endpoints[slave.name].ns
            assert slave_ns is not None
            mark = len(slave.log_text())
            # in the slave's namespace, atomically: the HA ports reset both ways (the
            # replication link dies at once) and the master's client port resets the slave
            for c in partition(master.name, slave.name, "ha"):
                net.cuts[c], net.refs[c] = "reject", 1
            client_port = (f"add rule inet {TABLE} output ip daddr {master.host} tcp dport {master.port} "
                           "meta l4proto tcp reject with tcp reset")
            _apply(net, slave_ns, {slave_ns: client_port})

            # the slave looks again later (before the fix: it took over at once)
            _wait("the slave to decide (probe again, or take over)",
                  lambda: CONFIRMING in slave.log_text()[mark:] or _took_over(slave), 60)
            assert not _took_over(slave), (
                "the slave took over from a live master whose ports refused for a moment:\n"
                + slave.log_text()[mark:][-3000:])
            net.apply()  # the master's client port answers the slave again; the HA ports still reset
            _wait("the slave to find the master answering again",
                  lambda: ANSWERS_AGAIN in slave.log_text()[mark:] or _took_over(slave), 60)
            assert not _took_over(slave), slave.log_text()[mark:][-3000:]
            assert master.alive and master.status().get("amq-ha-role") == "master"

            net.heal_all()
            assert pair.wait_in_sync(60) is slave
            assert pair.wait_master(30) is master
            assert not _took_over(slave), slave.log_text()[mark:][-3000:]
            assert not any(line.startswith("role fenced") for line in master.lines), master.lines
    finally:
        net.close()
