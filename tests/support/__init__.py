"""What the tests share and are not tests themselves (pyproject puts tests/ on sys.path).

No test module imports another: a helper two test files need lives here.
Scripts the tests start by path (dist_rank.py, wheel_smoke.py, the
schemathesis hooks) live here too and are found through ``SUPPORT``.
"""

from __future__ import annotations

import pathlib

SUPPORT = pathlib.Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent  # the repository: emlx_async/, benchmarks/, tools/, README.md
