import sys

from .cli import main

# `python -m emlx_async.serve [options]` is `emlx-async serve [options]`.
raise SystemExit(main(["serve", *sys.argv[1:]]))
