"""A broker with a users file: nothing but the probes and metrics without a login, and
nothing changes state without one (a real ``amq broker run --users --http`` process)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from http_helpers import Console, running_console, send

from amqtransport.broker.config import hash_password

USER, PASSWORD = "alice", "s3cret!"


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("auth")
    users = tmp / "users.txt"
    users.write_text(f"{USER}:{hash_password(PASSWORD)}\nbob:plain\n")
    with running_console(tmp, args=["--users", str(users)]) as c:
        send(c.uri, "secret.q", ["1", "2"], login=USER, passcode=PASSWORD)
        yield c


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _depth(console: Console) -> int:
    r = requests.get(console.url + "/api/queues/secret.q", headers=_basic(USER, PASSWORD), timeout=10)
    assert r.status_code == 200, r.text
    return int(r.json()["depth"])


def test_probes_and_metrics_need_no_login(console: Console) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/static/console.css"):
        assert requests.get(console.url + path, timeout=10).status_code == 200, path


def test_pages_redirect_to_the_login_and_the_api_answers_401(console: Console) -> None:
    r = requests.get(console.url + "/queues/secret.q", timeout=10, allow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login?next=%2Fqueues%2Fsecret.q")
    for path in ("/api/overview", "/api/destinations", "/api/queues/secret.q/messages", "/api/connections"):
        r = requests.get(console.url + path, timeout=10)
        assert r.status_code == 401, path
        assert "secret.q" not in r.text
    assert requests.get(console.url + "/api/session", timeout=10).json()["auth_required"] is True


def test_no_action_without_authentication_even_with_a_valid_csrf_token(console: Console) -> None:
    anon = requests.Session()
    token = anon.get(console.url + "/api/session", timeout=10).json()["csrf_token"]
    for path in ("/api/queues/secret.q/purge", "/api/send"):
        r = anon.post(console.url + path, json={"destination": "/queue/secret.q", "body": "x"},
                      headers={"X-CSRF-Token": token}, timeout=10)
        assert r.status_code == 401, (path, r.text)
    r = anon.post(console.url + "/api/queues/secret.q/purge", headers={"X-CSRF-Token": token, **_basic(USER, "wrong")},
                  timeout=10)
    assert r.status_code == 401
    assert _depth(console) == 2
    log = console.proc.log_text()
    assert "refused POST /api/queues/secret.q/purge" in log and "bad credentials" in log


def test_basic_credentials_with_their_csrf_token(console: Console) -> None:
    auth = _basic("bob", "plain")
    session = requests.get(console.url + "/api/session", headers=auth, timeout=10).json()
    assert session["user"] == "bob"
    r = requests.post(console.url + "/api/send", json={"destination": "/queue/secret.basic", "body": "b"},
                      headers=auth, timeout=10)
    assert r.status_code == 403  # credentials alone are not enough: a browser resends them by itself
    r = requests.post(console.url + "/api/send", json={"destination": "/queue/secret.basic", "body": "b"},
                      headers={**auth, "X-CSRF-Token": session["csrf_token"]}, timeout=10)
    assert r.status_code == 200, r.text
    # the token is bound to the identity: alice's does not work for bob
    alice = requests.get(console.url + "/api/session", headers=_basic(USER, PASSWORD), timeout=10).json()
    r = requests.post(console.url + "/api/send", json={"destination": "/queue/secret.basic", "body": "b"},
                      headers={**auth, "X-CSRF-Token": alice["csrf_token"]}, timeout=10)
    assert r.status_code == 403
    assert "POST /api/send by user 'bob'" in console.proc.log_text()


def test_login_session_csrf_and_logout(console: Console) -> None:
    s = requests.Session()
    page = s.get(console.url + "/login?next=/queues/secret.q", timeout=10).text
    token = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    r = s.post(console.url + "/api/login", data={"user": USER, "password": "nope", "csrf_token": token,
                                                 "_next": "/queues/secret.q"}, timeout=10, allow_redirects=False)
    assert r.status_code == 303 and "error=1" in r.headers["location"]
    r = s.post(console.url + "/api/login", data={"user": USER, "password": PASSWORD, "_next": "/"},
               timeout=10, allow_redirects=False)
    assert r.status_code == 403  # a login form needs its token too
    r = s.post(console.url + "/api/login", data={"user": USER, "password": PASSWORD, "csrf_token": token,
                                                 "_next": "/queues/secret.q"}, timeout=10, allow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/queues/secret.q"
    cookie = next(c for c in s.cookies if c.name.startswith("amq_session_"))
    assert cookie.name == f"amq_session_{console.http_port}"
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
    page = s.get(console.url + "/queues/secret.q", timeout=10)
    assert page.status_code == 200 and "alice" in page.text
    token = page.text.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    r = s.post(console.url + "/api/queues/secret.q/purge", headers={"Accept": "application/json"}, timeout=10)
    assert r.status_code == 403  # the session cookie without the token
    r = s.post(console.url + "/api/queues/secret.q/purge", headers={"X-CSRF-Token": token,
                                                                      "Accept": "application/json"}, timeout=10)
    assert r.status_code == 200 and r.json()["message"] == "purged 2 messages from secret.q"
    assert "POST /api/queues/secret.q/purge by user 'alice'" in console.proc.log_text()
    r = s.post(console.url + "/api/logout", headers={"X-CSRF-Token": token, "Accept": "application/json"},
               timeout=10)
    assert r.status_code == 200
    assert s.get(console.url + "/api/overview", timeout=10).status_code == 401


def test_the_users_file_is_the_brokers(tmp_path: Path) -> None:
    """An unknown user of the STOMP port is unknown to the console too."""
    users = tmp_path / "users.txt"
    users.write_text("carol:pw\n")
    with running_console(tmp_path, args=["--users", str(users)], name="c2") as c:
        assert requests.get(c.url + "/api/node", headers=_basic("carol", "pw"), timeout=10).status_code == 200
        assert requests.get(c.url + "/api/node", headers=_basic(USER, PASSWORD), timeout=10).status_code == 401
