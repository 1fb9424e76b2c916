"""``mx.fft`` as awaitables on the owning queue (on the worker thread's CPU stream)."""

from .ops import _make
from ._op_table import OPS

for _name, _arrays, _params, _ in OPS:
    if _name.startswith("fft_"):
        globals()[_name[len("fft_"):]] = _make(_name, _arrays, _params)
