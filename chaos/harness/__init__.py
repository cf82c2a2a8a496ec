"""What every chaos run stands on, shared by the scenarios and the nemesis.

- :mod:`.cluster`: brokers (a "cluster": our pair, one node, an ActiveMQ pair, a bridged
  spoke) behind Toxiproxy proxies (a "stage"), and the run's scratch directory.
- :mod:`.clients`: how a run's clients connect (:class:`~.clients.ClientSettings`).
"""
