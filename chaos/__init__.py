"""Chaos tools: a Toxiproxy-compatible proxy server and fault-injection scenarios."""
