"""``amqtransport.aio``: the asyncio client, with the sync client's URIs, options,
exceptions, duplicate filter and failover guarantees (docs/client-async.md)::

    import amqtransport.aio as aio

    async with aio.connect("failover:(tcp://a:61613,tcp://b:61613)") as conn:
        await conn.send("/queue/orders", b"...")          # returns once receipted
        sub = await conn.subscribe("/queue/orders", ack="client-individual")
        async for msg in sub:
            await msg.ack()
        reply = await conn.request("/queue/prices", b"EURUSD", timeout=5)  # RequestTimeout if none
        async for msg in conn.browse("/queue/orders"):   # what it holds; nothing consumed
            print(msg.text)
"""

from amqtransport.aio.connecting import connect
from amqtransport.aio.connection import (
    AsyncConnection,
    AsyncMessage,
    AsyncProducer,
    AsyncSubscription,
    AsyncTransaction,
)
from amqtransport.aio.failover import AsyncFailoverTransport
from amqtransport.errors import RequestTimeout

__all__ = ["AsyncConnection", "AsyncFailoverTransport", "AsyncMessage", "AsyncProducer", "AsyncSubscription",
           "AsyncTransaction", "RequestTimeout", "connect"]
