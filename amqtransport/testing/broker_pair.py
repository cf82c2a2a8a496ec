"""The broker pair for tests: :class:`~amqtransport.processes.pair.BrokerPair` (the code
lives in :mod:`amqtransport.processes`, which ``amq broker pair`` uses too)."""

from __future__ import annotations

from amqtransport.processes.pair import SECRET_FILE, BrokerPair, HaNodeProcess

__all__ = ["BrokerPair", "HaNodeProcess", "SECRET_FILE"]
