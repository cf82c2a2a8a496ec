"""Free ports for tests: :func:`~amqtransport.processes.ports.free_port` (the code lives
in :mod:`amqtransport.processes`)."""

from __future__ import annotations

from amqtransport.processes.ports import ephemeral_range, free_port

__all__ = ["ephemeral_range", "free_port"]
