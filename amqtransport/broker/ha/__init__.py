"""Two-node high availability for the embedded broker (master/slave pairs).

- :mod:`.node`: one node's role loop (master / slave / cold backup) for both kinds of
  pair, with the theory of operation; :func:`~.node.run_node` is what
  ``amq broker run --ha ...`` calls. :mod:`.shared`: the role loop of a shared-store pair;
  :mod:`.master`: a term as master (the broker, the receipt gate, a lost slave, a split brain).
  Each role sees the node through a declared Protocol (:mod:`.host`).
- :mod:`.decide`: who is master -- the decision table of a replicated node as pure
  functions, with every partition case.
- :mod:`.port`: the HA port (one CONNECT per connection), the answer to every HA request
  and the status headers. :mod:`.view`: the node in the HTTP console.
- :mod:`.lock`: the exclusive file lock that elects the master of a shared-store pair.
- :mod:`.epoch`: ``ha-state.json``, the store epoch and what a node knows of its peer.
- :mod:`.replication`: the replication link's theory and its master side (full sync,
  record stream, receipt gate); :mod:`.slave`: its slave side (join, apply and ack,
  and what a slave does when it loses its master);
  :mod:`.wire`: the bytes on an HA connection and the asking side of every request.
- :mod:`.config`: the node's options (:class:`~.config.HaOptions`, the HA port's bounds) and
  the ``[ha]`` table of a broker config file.

A pair as two child processes: :class:`amqtransport.processes.pair.BrokerPair`; commands:
``amq broker pair`` and ``amq broker status``.
"""
