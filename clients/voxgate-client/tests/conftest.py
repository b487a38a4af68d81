"""One real server for the session (see voxgate_client.testing for where it comes from)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from voxgate_client.testing import LocalServer


@pytest.fixture(scope="session")
def target() -> Iterator[str]:
    with LocalServer() as srv:
        yield srv.target
