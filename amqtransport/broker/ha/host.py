"""The node as its roles see it: what a master's term (:mod:`.master`) and a slave's side
(:mod:`.slave`) both read and call on :class:`.node.HaNode`.

Each role module declares a :class:`~typing.Protocol` of what it uses (``MasterHost``,
``SlaveHost``; ``SharedHost`` for a shared-store pair, ``PortHost`` for the HA port),
so none of them imports the node and the node is the one module that knows them all.
:class:`RoleHost` is the part the two replicated roles share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from ..config import BrokerConfig
from .auth import HaRequest
from .config import HaOptions
from .decide import Decision, NodeState, PeerAnswer, Phase
from .epoch import HaState

__all__ = ["RoleHost"]


class RoleHost(Protocol):
    """What both replicated roles read and call on the node."""

    name: str
    data_dir: Path
    config: BrokerConfig
    opts: HaOptions
    state: HaState
    loop: asyncio.AbstractEventLoop | None
    journal_damage: str  # what reading the journal found wrong ("" nothing; cleared by a full sync)

    @property
    def stopping(self) -> bool: ...

    def say(self, line: str) -> None:
        """One line for the operator (stdout)."""

    def set_role(self, role: str, detail: str = "") -> None:
        """Take ``role`` and say so."""

    def request_headers(self, request_header: str) -> HaRequest:
        """A request to another node, signed when it is sent (:class:`.auth.HaRequest`)."""
        ...

    def peer_addresses(self) -> list[tuple[str, int]]:
        """Every address the node knows for its peer."""
        ...

    def decision_state(self, phase: Phase, *, goodbye: bool = False, slave_was_synced: bool = False) -> NodeState:
        """What :func:`.decide.decide` reads of the node now."""
        ...

    async def decide_observing(
        self, read_state: Callable[[], NodeState], ask: Callable[[], Awaitable[list[PeerAnswer]]] | None = None
    ) -> Decision:
        """Decide, making each observation the table asks for."""
        ...
