"""A real OTLP/HTTP traces receiver on loopback for tests: it decodes every request
with opentelemetry-proto (a dev dependency, imported when the receiver starts) and
keeps the spans (``opentelemetry.proto.trace.v1.Span`` messages)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Receiver", "receiving"]


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback: every span it was sent, decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[Any] = []
        self.paths: list[str] = []
        spans, paths = self.spans, self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                paths.append(self.path)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, name: str) -> list[Any]:
        return [s for s in list(self.spans) if s.name == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A :class:`Receiver` for the ``with`` block."""
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
