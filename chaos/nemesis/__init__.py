"""The nemesis: randomized, seeded fault rounds against our HA pair under a mixed
workload, judged by a pure checker over the recorded history.

``amq chaos run nemesis [--rounds N] [--mode replicated|shared-store|both] [--seed S]
[--report DIR]`` runs it (docs/chaos.md, "The nemesis"). The pieces:

* :mod:`chaos.nemesis.schedule` -- the pure, seeded fault schedule;
* :mod:`chaos.nemesis.history` -- what a run records (and ``report.json`` carries);
* :mod:`chaos.nemesis.checker` -- the rules, a pure function of the history, with
  :mod:`chaos.nemesis.availability` (the share of 1-s windows served, per fault kind);
* :mod:`chaos.nemesis.cluster` -- the pair with proxies on every link, tmpfs data
  directories, the spoke broker and the bridge;
* :mod:`chaos.nemesis.workload` -- the clients, recording what they did and saw;
* :mod:`chaos.nemesis.probe` -- who answers clients, every 50 ms;
* :mod:`chaos.nemesis.faults` -- a plan's steps done and undone on the real processes;
* :mod:`chaos.nemesis.netns` -- the nodes in network namespaces, links cut by nftables;
* :mod:`chaos.nemesis.lazyfs` -- a FUSE layer that loses unsynced writes on power loss;
* :mod:`chaos.nemesis.bitflip` -- one bit flipped in a stopped node's journal record;
* :mod:`chaos.nemesis.runner` -- one mode's run, round after round;
* :mod:`chaos.nemesis.cli` -- the command's body: modes, summary, report, Ctrl-C.
"""
