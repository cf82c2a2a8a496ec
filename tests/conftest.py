"""Shared test configuration: fixture modules are registered here, one line each."""

pytest_plugins = [
    "amqtransport.testing.pytest_fixtures",
    "amqtransport.testing.rabbitmq_fixtures",
]
