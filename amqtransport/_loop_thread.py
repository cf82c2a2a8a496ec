"""The old, private name of :mod:`amqtransport.loop_thread`, kept so that code written
before the rename still imports; new code imports ``amqtransport.loop_thread``."""

from __future__ import annotations

from amqtransport.loop_thread import LoopThread

__all__ = ["LoopThread"]
