"""The sync client's classes, generated from the asyncio client (``connection.py``,
by ``scripts/async_to_sync.py``) with its seams (``flavour.py``). The public names are
:mod:`amqtransport.client`'s; import them from there."""
