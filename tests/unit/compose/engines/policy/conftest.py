"""Fixtures for the reference policy server tests (in-process ASGI clients)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from compose.engines.policy import PolicySettings, create_app


@pytest.fixture
async def make_client():
    clients: list[httpx.AsyncClient] = []

    def factory(**settings: Any) -> httpx.AsyncClient:
        app = create_app(PolicySettings(**settings))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://policy")
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()


@pytest.fixture
async def client(make_client):
    return make_client()
