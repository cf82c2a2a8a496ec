"""Fixtures of the HTTP tests: a real headless browser (Debian's chromium, driven by
selenium through Debian's chromium-driver; ``scripts/setup.sh`` installs both)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = os.environ.get("AMQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AMQ_CHROMEDRIVER", "/usr/bin/chromedriver")
# what headless chromium needs on these machines (no sandbox as root, no GPU, no network
# but loopback: background services would only fail to reach their hosts)
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,1000")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(path):
            pytest.skip(f"{path} not found: install Debian's {package} (scripts/setup.sh does, as root)")
    profile = tempfile.mkdtemp(prefix="amq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as exc:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"chromium cannot run here: {str(exc).splitlines()[0]}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
