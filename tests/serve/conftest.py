"""Clients of a live server, for every test file here that defines a `server` fixture
(a support.helpers.ServerProcess): plain HTTP, the openai client and the anthropic client.

The timeouts are generous: on a loaded machine a constrained answer takes minutes, and
pytest-timeout ends a test that really hangs.
"""

from __future__ import annotations

import pytest

CLIENT_TIMEOUT = 300


@pytest.fixture
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=CLIENT_TIMEOUT) as client:
        yield client


@pytest.fixture
def openai_client(server):
    import openai

    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                       timeout=CLIENT_TIMEOUT) as client:
        yield client


@pytest.fixture
def anthropic_client(server):
    import anthropic

    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT) as client:
        yield client
