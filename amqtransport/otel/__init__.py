"""OpenTelemetry instrumentation of the amqtransport clients (sync and asyncio), in
the manner of the OpenTelemetry Python contrib instrumentors (docs/tracing.md)::

    from amqtransport.otel import AmqtransportInstrumentor
    AmqtransportInstrumentor().instrument(tracer_provider=tp, meter_provider=mp)
    ...
    AmqtransportInstrumentor().uninstrument()

Needs the ``otel`` extra (``pip install amqtransport[otel]``); the package itself never
imports this module, so without it nothing is imported and nothing changes.
``opentelemetry-instrument python app.py`` finds it through the
``opentelemetry_instrumentor`` entry point.
"""

from amqtransport.otel.instrumentor import AmqtransportInstrumentor

__all__ = ["AmqtransportInstrumentor"]
