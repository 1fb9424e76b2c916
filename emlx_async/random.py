"""``mx.random`` as awaitables on the owning queue, with mlx's signatures.

Every call runs natively with an explicit key. Given ``key=``, the result is
the same as mlx's on any queue. Without one, the key comes from MLX's global
random state at the moment of the call, on the calling thread, exactly as a
key-less ``mx.random`` call would take it: ``mx.random.seed(s)`` followed by
the same sequence of key-less calls gives the same numbers through
``ea.random`` as through ``mx.random``, whatever queues or devices the calls
go to, and both draw from one state (an ``mx.random.normal()`` between two
``ea.random`` calls consumes a key like any other). The key is drawn when
the call is made, not when its job runs, so submission order decides which
call gets which key. The workers' own per-thread MLX key sequences are never
used.

``seed(s)`` is ``mx.random.seed``. The functions are generated
(emlx_async/_generated_random.py, by tools/gen_api.py).
"""

from mlx.core.random import seed as seed

from ._generated_random import *  # noqa: F401, F403
from ._generated_random import __all__ as _generated

__all__ = [*_generated, "seed"]
