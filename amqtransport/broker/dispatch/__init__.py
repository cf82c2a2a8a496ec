"""The broker's dispatch core: where a message goes once a connection has accepted it.

No sockets, no event loop, no threads of its own: the connections (and the operator's
actions) call the core on the loop thread; it answers with deliveries to
:class:`~.model.Sink` objects and hands durable changes to the store
(:class:`~amqtransport.broker.store.MessageStore`), whose journal does the I/O.

- :mod:`.core`: :class:`~.core.BrokerCore`, the facade the connections call (send,
  subscribe, ack, begin/commit/abort) and that wires the modules below together.
- :mod:`.registry`: what exists (queues, topics, subscriptions, counters), paging and
  the expiry sweep; :mod:`.queues`: a queue and its dispatch loop; :mod:`.topics`:
  fan-out; :mod:`.virtual`: virtual topics; :mod:`.scheduling` and :mod:`.cron`: scheduled delivery; :mod:`.wildcards`: wildcard queue consumers; :mod:`.advisories`: consumer
  advisories; :mod:`.backlog`: a slow topic subscriber's bounded backlog.
- :mod:`.acks`: ACK, NACK, redelivery and the dead-letter queue;
  :mod:`.transactions`: BEGIN .. COMMIT/ABORT.
- :mod:`.model`: subscriptions, topics, transaction state; :mod:`.message`: the
  broker's message; :mod:`.names`: destination names as the broker maps them;
  :mod:`.memory`: memory accounting and flow control's water marks;
  :mod:`.errors`: :class:`~.errors.CoreError`, a request the core refuses.

The clocks are injected: :class:`~.core.BrokerCore` takes ``clock`` (wall-clock seconds:
timestamps, expiry) and ``monotonic`` (the memory gauge's flow-control time) from the
server, so no module here imports ``time`` (``tests/test_layering.py`` checks the
package pure: no I/O, thread, loop or clock import), and a test drives a virtual clock
(``tests/broker/test_dispatch_units.py``).
"""
