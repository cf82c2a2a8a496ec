"""The side port's parsers and small parts, in process: every parser is fuzzed
(hypothesis) and must either answer or name the problem, never crash."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqtransport.broker.config import parse_http_address
from amqtransport.broker.http.api import BadRequest, parse_body, parse_headers
from amqtransport.broker.http.h11_server import HttpLimits, HttpServer, Request, Response
from amqtransport.broker.http.security import Identity, Security, _basic, _host_only
from amqtransport.broker.ops.stats import Histogram


# ---------------------------------------------------------------------- addresses
@pytest.mark.parametrize(("text", "want"), [
    ("8161", ("127.0.0.1", 8161)), ("0", ("127.0.0.1", 0)), ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("[::1]:9000", ("::1", 9000)), (" localhost:1 ", ("localhost", 1)),
])
def test_http_address(text: str, want: tuple[str, int]) -> None:
    assert parse_http_address(text) == want


@pytest.mark.parametrize("text", ["", "x", ":80", "host:", "h:65536", "h:-1", "h:8o"])
def test_bad_http_address_names_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT|empty host"):
        parse_http_address(text)


@given(st.text(max_size=40))
def test_http_address_fuzz(text: str) -> None:
    try:
        host, port = parse_http_address(text)
    except ValueError as exc:
        assert "HTTP" in str(exc)
    else:
        assert 0 <= port <= 65535 and host


# ---------------------------------------------------------------------- bodies
def test_form_and_json_bodies() -> None:
    form = parse_body("application/x-www-form-urlencoded", b"ids=a&ids=b&all=on&to=q&headers=k%3A+v%0Ax%3Ay")
    assert form.strings("ids") == ["a", "b"] and form.flag("all") and form.text("to") == "q"
    assert form.headers() == {"k": "v", "x": "y"}
    js = parse_body("application/json; charset=utf-8", json.dumps({"ids": ["x"], "headers": {"n": 1, "b": True}}).encode())
    assert js.strings("ids") == ["x"] and js.headers() == {"n": "1", "b": "true"}
    assert parse_body("application/json", b"  ").fields == {}


@pytest.mark.parametrize(("ctype", "body", "words"), [
    ("application/json", b"{", "not valid JSON"), ("application/json", b"3", "JSON object"),
    ("text/plain", b"x", "unsupported Content-Type"), ("application/x-www-form-urlencoded", b"\xff=1", "UTF-8"),
])
def test_bad_bodies_name_the_problem(ctype: str, body: bytes, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        parse_body(ctype, body)


def test_header_lines() -> None:
    assert parse_headers("a: 1\n\n b :2:3 \n") == {"a": "1", "b": "2:3"}
    with pytest.raises(BadRequest, match="line 2"):
        parse_headers("a: 1\nnocolon")


@given(st.sampled_from(["application/json", "application/x-www-form-urlencoded", "", "text/xml"]),
       st.binary(max_size=200))
def test_body_fuzz(ctype: str, body: bytes) -> None:
    try:
        form = parse_body(ctype, body)
        for name in ("ids", "all", "to", "headers", "destination"):
            try:
                form.strings(name)
                form.flag(name)
                form.text(name)
                form.headers()
            except BadRequest:
                pass
    except BadRequest as exc:
        assert str(exc)


# ---------------------------------------------------------------------- security
@given(st.text(max_size=60))
def test_basic_credentials_fuzz(text: str) -> None:
    user, password = _basic(text)
    assert (user is None) == (password is None)


@pytest.mark.parametrize(("value", "host"), [("127.0.0.1:80", "127.0.0.1"), ("[::1]:8", "::1"),
                                             ("LocalHost", "localhost"), ("::1", "::1")])
def test_host_only(value: str, host: str) -> None:
    assert _host_only(value) == host


def _req(method: str = "GET", **headers: str) -> Request:
    return Request(method, "/", "/", {}, {k.replace("_", "-"): v for k, v in headers.items()}, b"", "t")


def test_csrf_tokens_are_bound_to_the_identity() -> None:
    sec = Security({"u": "p"}, bound_host="127.0.0.1")
    sid = sec.new_session("u")
    mine = Identity("u", "session", sid)
    other = Identity("u", "session", sec.new_session("u"))
    assert sec.csrf_ok(mine, sec.csrf_token(mine))
    assert not sec.csrf_ok(other, sec.csrf_token(mine))
    assert not sec.csrf_ok(Identity("u", "basic"), sec.csrf_token(mine))
    assert not sec.csrf_ok(mine, "")
    assert Security(None, bound_host="127.0.0.1").csrf_token(mine) != sec.csrf_token(mine)  # per process


def test_sessions_expire_and_end() -> None:
    now = [0.0]
    sec = Security({"u": "p"}, bound_host="0.0.0.0", clock=lambda: now[0])
    sec.set_port(9)
    sid = sec.new_session("u")
    assert sec.identify(_req(cookie=f"other=1; amq_session_9={sid}")).user == "u"
    now[0] = 13 * 3600
    assert sec.identify(_req(cookie=f"amq_session_9={sid}")).user is None
    sid = sec.new_session("u")
    sec.end_session(sid)
    assert sec.identify(_req(cookie=f"amq_session_9={sid}")).user is None


def test_origin_and_host_rules() -> None:
    local = Security(None, bound_host="127.0.0.1")
    assert local.cross_origin(_req(host="localhost:1")) is None
    assert "loopback" in (local.cross_origin(_req(host="attacker.example:1")) or "")
    assert "cross-origin" in (local.cross_origin(_req("POST", host="127.0.0.1:1", origin="http://127.0.0.1:2")) or "")
    assert "cross-origin" in (local.cross_origin(_req("POST", host="127.0.0.1:1", origin="null")) or "")
    assert local.cross_origin(_req("GET", host="127.0.0.1:1", origin="http://elsewhere")) is None
    wide = Security(None, bound_host="0.0.0.0")
    assert wide.cross_origin(_req(host="broker.internal:8161")) is None


# ---------------------------------------------------------------------- histogram
def test_histogram_is_cumulative() -> None:
    h = Histogram([0.1, 1.0])
    for v in (0.05, 0.1, 0.5, 5.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.buckets == ((0.1, 2), (1.0, 3)) and snap.count == 4 and snap.sum == pytest.approx(5.65)
    assert snap.quantile(0.5) == 0.1 and snap.quantile(0.75) == 1.0 and snap.quantile(1.0) is None
    with pytest.raises(ValueError):
        Histogram([1.0, 1.0])


# ---------------------------------------------------------------------- the wire
@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=5))
def test_wire_fuzz_answers_or_closes(chunks: list[bytes]) -> None:
    """Any bytes: the server answers (a status line) or closes, and keeps serving."""

    async def scenario() -> None:
        async def handler(req: Request) -> Response:
            return Response(200, req.body[:10])

        server = HttpServer(handler, "127.0.0.1", 0, HttpLimits(max_head=512, max_body=256, idle_timeout=0.5))
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            for chunk in chunks:
                writer.write(chunk)
            writer.write_eof()
            data = await asyncio.wait_for(reader.read(), 5)
            assert data == b"" or data.startswith(b"HTTP/1.1 ")
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200 OK")
            writer.close()
        finally:
            await server.stop()

    asyncio.run(scenario())
