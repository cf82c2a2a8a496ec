"""One client connection of the broker: the asyncio ``Protocol`` for one socket.

The connection is one object, :class:`~.protocol.BrokerConnection` (:mod:`.protocol`: the
STOMP frame handlers, which call the dispatch core), a :mod:`.stream` (``StompStream``:
reading, the frame parser, buffered output, back-pressure, heart-beats) that owns a
:mod:`.flow` gate (``FlowGate``, a part: SENDs parked while memory is short).
:mod:`.context`: what a connection may use of the broker around it
(:class:`~.context.BrokerContext`) and the connect hook an HA node declares.
"""
