"""``mx.linalg`` as awaitables on the owning queue.

MLX runs these on the CPU only; the shim puts them on the worker thread's
CPU stream, so they work from GPU queues too.
"""

from .ops import _make
from ._op_table import OPS

for _name, _arrays, _params, _ in OPS:
    if _name.startswith("linalg_"):
        globals()[_name[len("linalg_"):]] = _make(_name, _arrays, _params)
