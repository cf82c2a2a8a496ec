"""Helpers shared by the bridge tests: polling for a condition, a one-connector TOML config."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from amqtransport.testing.wait import wait_for as _wait_for


def wait_for(cond: Callable[[], object], timeout: float, what: str = "condition") -> None:
    """Poll ``cond()`` every 20 ms until it is true; AssertionError naming ``what`` after ``timeout``."""
    _wait_for(cond, timeout, what, interval=0.02)


def connector_toml(local: str, remote: str, name: str, extra: Mapping[str, object]) -> str:
    """A bridge config with one ``[[network_connector]]`` named ``name``; ``extra`` are its keys."""
    lines = [f'local_uri = "{local}"', 'status_listen = "127.0.0.1:0"', "[[network_connector]]",
             f'name = "{name}"', f'uri = "{remote}"']
    for k, v in extra.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, list):
            lines.append(f"{k} = [" + ", ".join(f'"{x}"' for x in v) + "]")
        elif isinstance(v, int):
            lines.append(f"{k} = {v}")
        else:
            lines.append(f'{k} = "{v}"')
    return "\n".join(lines) + "\n"
