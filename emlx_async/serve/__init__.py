"""An OpenAI-compatible HTTP service on the engine (needs the `serve` extra).

``emlx-async serve`` (or ``python -m emlx_async.serve``) runs it under
uvicorn on uvloop; ``create_app(ServeConfig(...))`` gives the ASGI app.
"""

from .service import ServeConfig as ServeConfig
from .app import create_app as create_app

__all__ = ["ServeConfig", "create_app"]
