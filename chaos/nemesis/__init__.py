"""The nemesis: randomized, seeded fault rounds against our HA pair under a mixed
workload, judged by a pure checker over the recorded history.

``amq chaos run nemesis [--rounds N] [--mode replicated|shared-store|both] [--seed S]
[--report DIR]`` runs it (``chaos/README.md``, "The nemesis"). The pieces:

* :mod:`chaos.nemesis.schedule` -- the pure, seeded fault schedule;
* :mod:`chaos.nemesis.history` -- what a run records (and ``report.json`` carries);
* :mod:`chaos.nemesis.checker` -- the rules, a pure function of the history.
"""
