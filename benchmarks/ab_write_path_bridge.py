"""A/B of the client write path on the bridge: the throughput part of bench_bridge.py
only (alternating rounds, N=20000 by default), plus socket writes per message counted
by wrapping SocketStream.write.

Run: .venv/bin/python benchmarks/ab_write_path_bridge.py [N]   (ROUNDS=4 for 4 rounds)
Old client: git worktree add --detach /tmp/base <commit>; then
  AMQ_BASE=/tmp/base BENCH_DIR=/tmp/base/benchmarks .venv/bin/python benchmarks/ab_write_path_bridge.py
(AMQ_BASE bypasses the editable install's finder so the old amqtransport is imported;
the brokers are started from the current tree either way.)
"""
import os
import statistics
import sys
import tempfile

if os.environ.get("AMQ_BASE"):  # measure the old client: bypass the editable-install finder
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, os.environ["AMQ_BASE"])
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.environ.get("BENCH_DIR", os.path.dirname(os.path.abspath(__file__))))
import bench_bridge as bb  # noqa: E402

from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rounds = int(os.environ.get('ROUNDS', '3'))
import amqtransport.transports.link as _s  # noqa: E402

print("client code:", _s.__file__, "load before:", os.getloadavg(), flush=True)
with tempfile.TemporaryDirectory(prefix="amq-bench-bridge-") as tmp:
    work = Path(tmp)
    with BrokerProcess(work / "spoke", args=("--name", "spoke")) as spoke, \
            BrokerProcess(work / "hub", args=("--name", "hub")) as hub:
        import amqtransport._backends.sockets as _sk
        _count = [0]
        _orig = _sk.SocketStream.write
        def _counting(self: _sk.SocketStream, data: bytes, _orig: Callable[[_sk.SocketStream, bytes], None] = _orig) -> None:
            _count[0] += 1
            return _orig(self, data)
        _sk.SocketStream.write = _counting  # type: ignore[method-assign]  # an A/B script counts the writes
        per_msg: dict[str, list[float]] = {"client-individual": [], "client": [], "direct": []}
        def counted(key: str, fn: Callable[..., float], *a: object) -> float:
            c0 = _count[0]
            r = fn(*a)
            per_msg[key].append((_count[0] - c0) / n)
            return r
        tp = bb.Throughput(spoke, hub, n, prefetch=1000)
        tp.direct()
        runs: dict[str, list[float]] = {"client-individual": [], "client": [], "direct": []}
        for _ in range(rounds):
            runs["client-individual"].append(counted("client-individual", tp.bridged, "client-individual"))
            runs["client"].append(counted("client", tp.bridged, "client"))
            runs["direct"].append(counted("direct", tp.direct))
            print({k: [round(x) for x in v] for k, v in runs.items()}, flush=True)
d = statistics.median(runs["direct"])
for m in ("client-individual", "client"):
    med = statistics.median(runs[m])
    print(f"{m}: bridged {med:.0f} direct {d:.0f} ratio {med/d:.2f}  bridged {min(runs[m]):.0f}..{max(runs[m]):.0f} direct {min(runs['direct']):.0f}..{max(runs['direct']):.0f}")
print("socket writes per message:", {k: [round(x, 2) for x in v] for k, v in per_msg.items()})
print("load after:", os.getloadavg())
