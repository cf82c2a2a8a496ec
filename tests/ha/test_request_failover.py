"""Request/reply across a SIGKILL of a replicated pair's master (amqtransport/aio/requests.py,
"Across a failover"): a request in flight is answered once, with its own reply, or
raises RequestTimeout, never answered twice; the requester's reply queue is re-created
on the new master, so the requests made after the takeover are answered."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import amqtransport
from amqtransport.errors import AmqTransportError, RequestTimeout
from amqtransport.testing.broker_pair import BrokerPair

pytestmark = pytest.mark.timeout(180)

SERVICE = "/queue/service"
FAST = "initialReconnectDelay=20&maxReconnectDelay=200"


class Responder:
    """Answers each request with its own body; once armed, it holds the next request
    until the test says the master was killed (that request is in flight across the kill)."""

    def __init__(self, uri: str) -> None:
        self.conn = amqtransport.connect(uri)
        self.sub = self.conn.subscribe(SERVICE)
        self.armed = threading.Event()  # hold the next request
        self.holding = threading.Event()  # the held request is here
        self.release = threading.Event()  # the master was killed: answer it now
        self.refused: list[str] = []  # replies the broker refused (the requester's old temp queue)
        self.answered = 0
        self.reply_to: list[str] = []  # the reply-to of each request, in order
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            for msg in self.sub:
                self.reply_to.append(msg.headers["reply-to"])
                if self.armed.is_set() and not self.holding.is_set():
                    self.holding.set()
                    self.release.wait(60)
                try:
                    self.conn.send(msg.headers["reply-to"], msg.body,
                                   headers={"correlation-id": msg.headers["correlation-id"]}, timeout=20)
                    self.answered += 1
                except AmqTransportError as exc:
                    self.refused.append(str(exc))
        except AmqTransportError:
            pass  # closed under it

    def close(self) -> None:
        self.release.set()
        self.conn.close()
        self.thread.join(timeout=30)


def test_a_request_in_flight_across_a_master_kill_is_answered_once_or_times_out(tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path) as bp:
        bp.wait_in_sync(30)
        uri = f"{bp.uri}&{FAST}"
        responder = Responder(uri)
        outcome: list[object] = []
        try:
            with amqtransport.connect(uri) as conn:
                assert conn.request(SERVICE, "warm-up", timeout=20).text == "warm-up"  # reply queue made
                responder.armed.set()

                def in_flight() -> None:
                    try:
                        outcome.append(conn.request(SERVICE, "across-the-kill", timeout=12))
                    except RequestTimeout as exc:
                        outcome.append(exc)

                requester = threading.Thread(target=in_flight, daemon=True)
                requester.start()
                assert responder.holding.wait(30), "the request never reached the responder"
                killed = bp.kill_master()
                bp.wait_master(30, exclude=killed)
                responder.release.set()
                requester.join(60)
                assert not requester.is_alive()
                # after the takeover the reply queue is a new one: new requests are answered
                after = [conn.request(SERVICE, f"after-{i}", timeout=30) for i in range(5)]
                assert [m.text for m in after] == [f"after-{i}" for i in range(5)]
        finally:
            responder.close()
    # the reply queue was made again on the new master, under a new remote name
    before, after_kill = responder.reply_to[0], responder.reply_to[-1]
    assert before.startswith("/remote-temp-queue/ID:") and after_kill.startswith("/remote-temp-queue/ID:")
    assert before != after_kill
    assert len(outcome) == 1
    result = outcome[0]
    if isinstance(result, RequestTimeout):
        assert result.destination == SERVICE and result.correlation_id
    else:  # answered: with its own reply, once (a second reply to it would have been dropped,
        # and none reached another request: each of the later ones got its own body back)
        assert isinstance(result, amqtransport.Message) and result.text == "across-the-kill"
