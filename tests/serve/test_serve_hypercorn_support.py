"""The check that guards the service's subclass of hypercorn's trio TCPServer:
a hypercorn release or shape it was not written against is refused at
start-up with a clear error, never half-handled (no model, no server)."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

pytest.importorskip("hypercorn")
pytest.importorskip("trio")

from emlx_async.serve.connections import ConnectionLimits, check_hypercorn, hypercorn_connections  # noqa: E402


@pytest.fixture
def hypercorn_version(monkeypatch):
    """Makes importlib.metadata report the given hypercorn version."""
    real = importlib.metadata.version

    def pretend(version: str) -> None:
        monkeypatch.setattr(importlib.metadata, "version",
                            lambda name: version if name.lower() == "hypercorn" else real(name))

    return pretend


def test_the_installed_hypercorn_is_supported():
    check_hypercorn()


@pytest.mark.parametrize("version", ["0.19.0", "1.0", "0.16.0", "unknown"])
def test_another_release_is_refused(hypercorn_version, version):
    hypercorn_version(version)
    with pytest.raises(RuntimeError, match=rf"^hypercorn {re.escape(version)} is not supported: .*--server uvicorn"):
        check_hypercorn()


def test_a_changed_trio_worker_is_refused(monkeypatch):
    import hypercorn.trio.tcp_server as tcp_server

    monkeypatch.delattr(tcp_server.TCPServer, "_read_data")
    with pytest.raises(RuntimeError, match=r"missing: _read_data"):
        check_hypercorn()


def test_a_worker_that_no_longer_builds_tcp_server_is_refused(monkeypatch):
    import hypercorn.trio.run as run

    monkeypatch.setattr(run, "TCPServer", type("Other", (), {}))
    with pytest.raises(RuntimeError, match=r"worker_serve building TCPServer"):
        check_hypercorn()


def test_the_subclass_serves_only_inside_the_block():
    import hypercorn.trio.run as run
    import hypercorn.trio.tcp_server as tcp_server

    with pytest.raises(KeyError), hypercorn_connections(ConnectionLimits(max_connections=3)):
        assert issubclass(run.TCPServer, tcp_server.TCPServer) and run.TCPServer is not tcp_server.TCPServer
        raise KeyError("the block failed")
    assert run.TCPServer is tcp_server.TCPServer


def test_the_cli_refuses_an_unsupported_hypercorn_before_serving(hypercorn_version):
    from emlx_async.serve import cli

    hypercorn_version("0.19.0")
    args = cli._parser().parse_args(["serve", "--server", "hypercorn"])
    with pytest.raises(SystemExit, match=r"^emlx-async serve --server hypercorn: hypercorn 0\.19\.0 is not supported"):
        cli._serve_hypercorn(args, None, None, ConnectionLimits())
