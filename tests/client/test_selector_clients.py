"""``selector=`` on ``subscribe`` (sync and asyncio) and ``amq recv --selector`` against our broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import amqtransport
import amqtransport.aio as aio
from amqtransport.broker import EmbeddedBroker
from amqtransport.cli.main import cli
from amqtransport.errors import BrokerError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def uri() -> Iterator[str]:
    with EmbeddedBroker(port=0) as b:
        yield f"tcp://127.0.0.1:{b.port}"


def test_sync_and_async_subscribe_take_a_selector(uri: str) -> None:
    with amqtransport.connect(uri) as c:
        for i in range(4):
            c.send("/queue/both", f"m{i}", headers={"n": str(i)})
        sub = c.subscribe("/queue/both", selector="n >= 2")
        assert [sub.receive(timeout=5).text for _ in range(2)] == ["m2", "m3"]  # type: ignore[union-attr]
        with pytest.raises(BrokerError, match="column 4"):
            c.subscribe("/queue/both", selector="n >")

    async def main() -> list[str]:
        async with aio.connect(uri) as conn:
            asub = await conn.subscribe("/queue/both", selector="n < 1")
            m = await asub.receive(timeout=5)
            assert m is not None
            with pytest.raises(BrokerError, match="column 4"):
                await conn.subscribe("/queue/both", selector="n >")
            rest = await conn.subscribe("/queue/both")  # the connection still works
            m2 = await rest.receive(timeout=5)
            assert m2 is not None
            return [m.text, m2.text]

    assert asyncio.run(main()) == ["m0", "m1"]


def test_amq_recv_selector(uri: str) -> None:
    with amqtransport.connect(uri) as c:
        for i, color in enumerate(["red", "blue", "red"]):
            c.send("/queue/cli-sel", f"m{i}", headers={"color": color})
    res = CliRunner().invoke(cli, ["recv", uri, "/queue/cli-sel", "--count", "2", "--timeout", "5",
                                   "--selector", "color = 'red'", "--print", "--json"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert lines[:-1] == ["m0", "m2"]
    assert json.loads(lines[-1])["received"] == 2
