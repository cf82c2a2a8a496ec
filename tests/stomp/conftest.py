"""Fixtures for the STOMP codec tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from stomp_codec_support import MODES, Events


@pytest.fixture(params=sorted(MODES))
def feed_mode(request: pytest.FixtureRequest) -> Callable[..., Events]:
    """Each test using it runs once per feeding mode: whole, byte by byte, with trailing data."""
    return MODES[request.param]
