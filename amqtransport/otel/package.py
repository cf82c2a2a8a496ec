"""What the instrumentation instruments (``BaseInstrumentor.instrumentation_dependencies``)."""

_instruments = ("amqtransport >= 0.1",)
