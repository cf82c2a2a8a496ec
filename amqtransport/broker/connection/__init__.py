"""One client connection of the broker: the asyncio ``Protocol`` for one socket.

The connection is one object, :class:`~.protocol.BrokerConnection`, built in three
layers: :mod:`.stream` (``StompStream``: reading, the frame parser, buffered output,
back-pressure, heart-beats), :mod:`.flow` (``FlowControlled``: SENDs parked while memory
is short) and :mod:`.protocol` (the STOMP frame handlers, which call the dispatch core).
:mod:`.context`: what a connection may use of the broker around it
(:class:`~.context.BrokerContext`) and the connect hook an HA node declares.
"""
