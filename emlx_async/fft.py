"""``mx.fft`` as awaitables on the owning queue (on the worker thread's CPU stream), with mlx's signatures.

Generated: emlx_async/_generated_fft.py, by tools/gen_api.py.
"""

from ._generated_fft import *  # noqa: F401, F403
from ._generated_fft import __all__ as __all__  # noqa: F401
