"""The operator's side of a broker: what the console, ``/metrics`` and
``amq broker status`` read, and the actions an operator may take.

- :mod:`.view`: :class:`~.view.NodeView`, immutable snapshots of a node (destinations,
  connections, journal, replication) and its readiness; ``ServerView`` reads a
  serving broker.
- :mod:`.admin`: :class:`~.admin.BrokerAdmin`, the operator's actions (browse, send,
  purge, move/retry, delete, close a connection).
- :mod:`.stats`: thread-safe histograms (the journal's fsync latency and batch sizes,
  the bridge's forward latency).

The HTTP side port that serves them is :mod:`amqtransport.broker.http`.
"""
