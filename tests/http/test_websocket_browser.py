"""Browsers on the WebSocket port, in a real browser: the real ``@stomp/stompjs`` (from
npm, installed by ``scripts/setup.sh`` into ``.venv/npm``, never copied into the
repository) in headless chromium.

1. A page sends 1,000 receipted messages to a queue through a replicated pair's two
   WebSocket ports while the master is SIGKILLed; stompjs reconnects with a
   ``beforeConnect`` that rotates through the pair's URLs (docs/websocket.md), finds the
   slave's port open once it took over, and sends again what was not receipted; a
   Python consumer through ``failover:`` receives every message exactly once.
2. A page subscribed to a topic shows what a Python producer sends.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.ports import free_port
from amqtransport.testing.wait import wait_for

pytestmark = pytest.mark.timeout(240)

WEB = Path(__file__).parent / "web"
STOMPJS = Path(sys.prefix) / "npm" / "node_modules" / "@stomp" / "stompjs" / "bundles" / "stomp.umd.min.js"
TOTAL = 1000


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test pages and stompjs on a loopback HTTP server: its base URL."""
    if not STOMPJS.exists():
        pytest.skip(f"{STOMPJS} not found: scripts/setup.sh installs @stomp/stompjs from npm (needs npm)")
    root = tmp_path_factory.mktemp("site")
    for page in WEB.glob("*.html"):
        shutil.copy(page, root / page.name)
    shutil.copy(STOMPJS, root / "stomp.umd.min.js")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="test-site")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerPair, list[str]]]:
    ws = [free_port(), free_port()]
    bp = BrokerPair("replicated", tmp_path_factory.mktemp("wspair"), link_timeout=1.0,
                    master_args=["--ws", f"127.0.0.1:{ws[0]}"], slave_args=["--ws", f"127.0.0.1:{ws[1]}"])
    with bp:
        bp.wait_in_sync()
        yield bp, [f"ws://127.0.0.1:{p}/ws" for p in ws]


def js(driver: Any, expr: str) -> Any:
    return driver.execute_script(f"return {expr};")


def test_browser_sends_1000_receipted_through_a_master_kill(browser: Any, site: str,
                                                            pair: tuple[BrokerPair, list[str]]) -> None:
    bp, urls = pair
    assert "listening on ws://" in "\n".join(bp.a.lines)
    browser.get(f"{site}/producer.html?urls={','.join(urls)}&count={TOTAL}&queue=/queue/web")
    wait_for(lambda: js(browser, "window.state.receipted.size") >= 300, 60, "300 receipts in the browser")
    master = bp.master
    assert master is bp.a
    master.kill()
    wait_for(lambda: js(browser, "window.state.receipted.size") == TOTAL, 120,
             "every message receipted by the browser after the takeover")
    assert bp.master is bp.b
    assert js(browser, "window.state.connects") >= 2, "the page reconnected"
    assert urls[1] in js(browser, "window.state.urlsUsed")
    got: Counter[str] = Counter()
    with amqtransport.connect(bp.uri) as c:
        sub = c.subscribe("/queue/web")
        while (m := sub.receive(timeout=3)) is not None:
            got[m.text] += 1
    assert set(got) == {f"web-{i}" for i in range(TOTAL)}, f"missing: {TOTAL - len(got)}"
    assert not [k for k, n in got.items() if n > 1], "a message reached the consumer twice"


def test_a_page_shows_what_a_python_producer_sends_to_a_topic(browser: Any, site: str,
                                                              pair: tuple[BrokerPair, list[str]]) -> None:
    bp, urls = pair
    master = bp.wait_master(30)
    url = urls[0] if master is bp.a else urls[1]
    browser.get(f"{site}/topic.html?url={url}&topic=/topic/web.news")
    wait_for(lambda: js(browser, "document.getElementById('status').textContent") == "subscribed", 30,
             "the page's subscription")
    with amqtransport.connect(bp.uri) as c:
        for i in range(5):
            c.send("/topic/web.news", f"news {i}")
    wait_for(lambda: js(browser, "document.querySelectorAll('#messages li').length") == 5, 30, "5 items on the page")
    assert js(browser, "[...document.querySelectorAll('#messages li')].map(e => e.textContent)") == [
        f"news {i}" for i in range(5)]
