"""Our broker as real child processes, and the plumbing they share.

- :mod:`.broker`: :class:`~.broker.BrokerProcess`, one ``amq broker run`` (the demo,
  chaos scenarios, tests that kill a broker the hard way);
- :mod:`.pair`: :class:`~.pair.BrokerPair`, a master/slave pair as two child
  processes (``amq broker pair``, the demo, chaos, the HA tests);
- :mod:`.witness`: :class:`~.witness.WitnessProcess`, one ``amq broker witness`` (the
  arbiter of replicated pairs) on a fixed free port (tests, chaos);
- :mod:`.spawn`: start a child with its log in a file, stop it by pid and reap it,
  kill what is left at exit, the STOMP readiness probe;
- :mod:`.ports`: free ports for a server that cannot bind port 0 itself.
- :mod:`.activemq`: Debian's ActiveMQ Classic as child processes, one node or a
  shared-store pair (``amq chaos run --mode activemq``, the interop tests);
- :mod:`.disk`: a size-limited tmpfs, filled on demand (the nemesis's full-disk fault,
  the full-disk tests).

Used by the command line (``amq broker pair``, ``amq demo``, ``amq chaos``) and by the
test harnesses of :mod:`amqtransport.testing`, which re-exports some of these names for tests.
"""
