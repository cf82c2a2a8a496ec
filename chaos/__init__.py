"""Chaos tools: a Toxiproxy-compatible proxy server (:mod:`chaos.proxy`), fault-injection
scenarios (:mod:`chaos.scenarios`) and the nemesis (:mod:`chaos.nemesis`)."""
