"""A/B of the client write path: the failover-vs-tcp and pipelined-vs-stomp.py parts
of bench_client.py only (3 rounds each, no recovery part).

Run: .venv/bin/python benchmarks/ab_write_path_client.py
Old client: AMQ_BASE=/tmp/base BENCH_DIR=/tmp/base/benchmarks (see ab_write_path_bridge.py).
"""
import os
import statistics
import sys

if os.environ.get("AMQ_BASE"):  # measure the old client: bypass the editable-install finder
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, os.environ["AMQ_BASE"])
import time  # noqa: E402

sys.path.insert(0, os.environ.get("BENCH_DIR", os.path.dirname(os.path.abspath(__file__))))
import bench_client as bc  # noqa: E402
from _common import compare, work_dir  # noqa: E402

from amqtransport.testing.broker_process import BrokerProcess  # noqa: E402

rounds = 3
import amqtransport.transports.link as _s  # noqa: E402

print("client code:", _s.__file__, "load before:", os.getloadavg(), flush=True)
tmp = work_dir("bench-client-")
with BrokerProcess(tmp / "data", log_dir=tmp / "logs") as broker:
    fo = f"failover:({broker.uri})"
    bc.producer_rate(broker.uri, 200)
    cpu: dict[str, list[float]] = {"fo": [], "tcp": []}
    def timed(key: str, uri: str) -> float:
        c0 = time.process_time()
        r = bc.producer_rate(uri, 10000)
        cpu[key].append((time.process_time() - c0) / 10000 * 1e6)
        return r
    c1 = compare(lambda: timed("fo", fo), lambda: timed("tcp", broker.uri), rounds=rounds)
    c2 = compare(lambda: timed("tcp", broker.uri), lambda: timed("fo", fo), rounds=rounds)
    print(f"failover/tcp both orders {(c1.ratio / c2.ratio) ** 0.5:.2f}  fo {statistics.median(c1.ours_all + c2.peer_all):.0f} tcp {statistics.median(c1.peer_all + c2.ours_all):.0f} msg/s; cpu us/msg fo {statistics.median(cpu['fo']):.1f} tcp {statistics.median(cpu['tcp']):.1f}", flush=True)
    c = compare(lambda: bc.producer_rate(fo, 10000), lambda: bc.stomppy_receipt_loop_rate(broker.port, 1000), rounds=rounds)
    print(f"pipelined vs stomp.py loop: ours {c.ours:.0f} peer {c.peer:.0f} ratio {c.ratio:.2f} ours_all {[round(x) for x in c.ours_all]} peer_all {[round(x) for x in c.peer_all]}", flush=True)
print("load after:", os.getloadavg())
