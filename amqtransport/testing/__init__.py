"""Harnesses that start real brokers (ours and ActiveMQ) as processes, for tests, benchmarks and examples."""
