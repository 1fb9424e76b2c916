"""The one dtype table shared by host calls, ops and ipc, and the integer ranges behind it.

Codes are positions in ``mlx::core::Dtype::Val`` order, which is what the
shim's ``dtype_of`` (cffi_src/common.cpp) decodes.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

DTYPES = [mx.bool_, mx.uint8, mx.uint16, mx.uint32, mx.uint64, mx.int8, mx.int16, mx.int32,
          mx.int64, mx.float16, mx.float32, mx.float64, mx.bfloat16, mx.complex64]
DTYPE_CODES = {dtype: code for code, dtype in enumerate(DTYPES)}

# The values each integer dtype (the C++ integer type of its width) holds:
# what MLX and the shim store is refused past these, never truncated.
INT_RANGES = {mx.uint8: (0, 2**8 - 1), mx.uint16: (0, 2**16 - 1), mx.uint32: (0, 2**32 - 1),
              mx.uint64: (0, 2**64 - 1), mx.int8: (-2**7, 2**7 - 1), mx.int16: (-2**15, 2**15 - 1),
              mx.int32: (-2**31, 2**31 - 1), mx.int64: (-2**63, 2**63 - 1)}
MAX_DIM = INT_RANGES[mx.int32][1]  # mlx::core::Shape holds int32 entries

# NumPy dtypes MLX can wrap without conversion (float64 stays a copy: CPU-only in MLX).
NUMPY_DTYPES = {np.dtype(np.bool_): mx.bool_, np.dtype(np.uint8): mx.uint8, np.dtype(np.uint16): mx.uint16,
                np.dtype(np.uint32): mx.uint32, np.dtype(np.uint64): mx.uint64, np.dtype(np.int8): mx.int8,
                np.dtype(np.int16): mx.int16, np.dtype(np.int32): mx.int32, np.dtype(np.int64): mx.int64,
                np.dtype(np.float16): mx.float16, np.dtype(np.float32): mx.float32,
                np.dtype(np.complex64): mx.complex64}

