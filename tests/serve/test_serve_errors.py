"""The service's own refusals raise the package's classes (each an EMLXError that
is also the builtin a caller catches): a bad setting is InvalidArgument (a
ValueError), a call the service cannot take now is InvalidState (a RuntimeError)."""

from __future__ import annotations

import importlib.metadata

import pytest

from emlx_async import EMLXError, InvalidArgument, InvalidState
from emlx_async.serve.connections import ConnectionLimits
from emlx_async.serve.middleware import api_key
from emlx_async.serve.models import parse_model
from emlx_async.serve.service import ServeConfig, Service


@pytest.mark.parametrize("refuse, match", [
    (lambda: ConnectionLimits(max_header_bytes=0), r"^max_header_bytes must be a positive int, got 0$"),
    (lambda: api_key(""), r"^an API key must not be empty$"),
    (lambda: parse_model("name="), r"^a model must be NAME=PATH with both parts, got 'name='$"),
    (lambda: Service(ServeConfig(mode="fast")), r"^mode must be 'auto', 'parallel' or 'batch', got 'fast'$"),
])
def test_a_bad_setting_is_an_invalid_argument_and_a_value_error(refuse, match):
    with pytest.raises(InvalidArgument, match=match) as caught:
        refuse()
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, EMLXError)


def test_a_service_not_started_refuses_background_work_as_invalid_state():
    service = Service(ServeConfig())

    async def job() -> None:
        pass

    with pytest.raises(InvalidState, match=r"^the service has not started$") as caught:
        service.run_in_background(job)
    assert isinstance(caught.value, RuntimeError)


def test_an_unsupported_hypercorn_is_invalid_state(monkeypatch):
    pytest.importorskip("hypercorn")
    pytest.importorskip("trio")
    from emlx_async.serve.connections import check_hypercorn

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.1.0" if name.lower() == "hypercorn" else real(name))
    with pytest.raises(InvalidState, match=r"^hypercorn 0\.1\.0 is not supported") as caught:
        check_hypercorn()
    assert isinstance(caught.value, RuntimeError)
