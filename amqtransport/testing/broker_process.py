"""One broker process for tests: :class:`~amqtransport.processes.broker.BrokerProcess`
(the code lives in :mod:`amqtransport.processes`, which ``amq demo`` uses too)."""

from __future__ import annotations

from amqtransport.processes.broker import BrokerProcess

__all__ = ["BrokerProcess"]
