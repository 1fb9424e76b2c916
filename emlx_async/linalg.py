"""``mx.linalg`` as awaitables on the owning queue, with mlx's signatures.

MLX runs these on the CPU only; the shim puts them on the worker thread's
CPU stream, so they work from GPU queues too. The functions are generated
(emlx_async/_generated_linalg.py, by tools/gen_api.py).
"""

from ._generated_linalg import *  # noqa: F401, F403
from ._generated_linalg import __all__ as __all__  # noqa: F401
