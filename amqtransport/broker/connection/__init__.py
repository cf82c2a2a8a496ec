"""One client connection of the broker: the asyncio ``Protocol`` for one socket.

The connection is :class:`~.protocol.BrokerConnection` (:mod:`.protocol`: the asyncio
protocol and the STOMP frame handlers, which call the dispatch core), composed of two
parts it owns: a :mod:`.stream` (``StompStream``: reading, the frame parser, buffered
output, back-pressure, heart-beats), to which it hands the socket's events, and a
:mod:`.flow` gate (``FlowGate``: SENDs parked while memory is short).
:mod:`.context`: what a connection may use of the broker around it
(:class:`~.context.BrokerContext`) and the connect hook an HA node declares.
"""
