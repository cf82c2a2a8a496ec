"""The console in a real browser: Debian's chromium, headless, driven by selenium through
Debian's chromium-driver (``scripts/setup.sh`` installs both). It loads the overview,
sees a queue's depth, sorts and filters the destinations, browses a DLQ message, retries
it back to its queue from the page and sees both depths change."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from http_helpers import Console, dead_letter, running_console, send

from amqtransport.testing.wait import wait_for as _wait_for


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with running_console(tmp_path_factory.mktemp("browser")) as c:
        dead_letter(c.uri, "orders", ["order 1", "order 2"])
        send(c.uri, "payments", ["p1", "p2", "p3"])
        yield c


def wait_for(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    # the page may be between two renders: an exception is "not yet"
    return _wait_for(check, timeout, what, interval=0.1, ignore=(Exception,))


def cell(driver: Any, table: str, name: str, column: str) -> str:
    from selenium.webdriver.common.by import By

    row = driver.find_element(By.CSS_SELECTOR, f'#{table} tr[data-name="{name}"]')
    return str(row.find_element(By.CSS_SELECTOR, f"td.{column}").text)


def test_console_in_a_real_browser(browser: Any, console: Console, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    d.get(console.url + "/")
    assert "Overview" in d.title
    assert d.find_element(By.ID, "node-role").text == "standalone"
    assert cell(d, "top-queues", "payments", "depth") == "3"
    assert cell(d, "top-queues", "DLQ.orders", "depth") == "2"
    # the rate chart is drawn by the live refresh (two samples make one rate)
    wait_for("a rate", lambda: d.find_element(By.ID, "rate-in").text not in ("", "–"))

    # destinations: live table, sort by depth, filter
    d.get(console.url + "/destinations")
    wait_for("the rates column", lambda: cell(d, "destinations", "payments", "rate_in") != "–")
    header = d.find_element(By.CSS_SELECTOR, '#destinations th[data-sort="depth"]')
    header.click()  # numbers sort deepest first
    names = [r.get_attribute("data-name") for r in d.find_elements(By.CSS_SELECTOR, "#destinations tbody tr")]
    assert names[:2] == ["payments", "DLQ.orders"], names
    d.find_element(By.ID, "filter").send_keys("dlq")
    names = [r.get_attribute("data-name") for r in d.find_elements(By.CSS_SELECTOR, "#destinations tbody tr")]
    assert names == ["DLQ.orders"], names

    # the DLQ page: browse without consuming, then retry one message from the page
    d.find_element(By.LINK_TEXT, "DLQ.orders").click()
    wait_for("the queue page", lambda: "Queue DLQ.orders" in d.title)
    rows = d.find_elements(By.CSS_SELECTOR, "#messages tr.message")
    assert len(rows) == 2
    bodies = [r.find_element(By.CSS_SELECTOR, "pre.body").text for r in rows]
    assert bodies == ["order 1", "order 2"]
    assert "from /queue/orders" in rows[0].text
    assert d.find_element(By.ID, "q-depth").text == "2"
    assert console.depth("DLQ.orders") == 2  # browsing consumed nothing
    rows[0].find_element(By.CSS_SELECTOR, "form.retry button").click()
    wait_for("the outcome", lambda: "moved 1 message" in d.find_element(By.ID, "flash").text)
    assert d.find_element(By.ID, "q-depth").text == "1"
    assert [r.find_element(By.CSS_SELECTOR, "pre.body").text
            for r in d.find_elements(By.CSS_SELECTOR, "#messages tr.message")] == ["order 2"]
    assert console.depth("DLQ.orders") == 1 and console.depth("orders") == 1

    # the destinations table shows the depth change without a reload of its own
    d.get(console.url + "/destinations")
    wait_for("orders in the table", lambda: cell(d, "destinations", "orders", "depth") == "1")
    assert cell(d, "destinations", "DLQ.orders", "depth") == "1"
    assert cell(d, "destinations", "orders", "dlq_depth") == "1"
    d.save_screenshot(str(tmp_path / "destinations.png"))
    logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"] if hasattr(d, "get_log") else []
    assert not logs, f"errors in the browser console: {logs}"
