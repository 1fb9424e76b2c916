"""Export files (.mlxfn) that are corrupted, truncated or not files: a clear error or the right answer,
and the process lives.

A standing fuzz: small traced functions are exported, their files corrupted
with seeded mutations (bit flips, overwritten bytes and fields, truncation,
cut or repeated chunks), and each is loaded with ``ea.load_traced`` and
replayed on the traced inputs in a child process (MLX's own loader dies on
some such files; the runtime must not). Kept short in the suite;
``EMLX_FUZZ_FILES=N`` asks for N cases (``EMLX_FUZZ_SEED`` moves the seeds).

Run as a script it fuzzes any checkout (``PYTHONPATH`` picks it) and prints
the outcome counts: ``python tests/replay/test_replay_files.py --cases 400``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import mlx.core as mx
import pytest

import emlx_async as ea
from emlx_async._native import ffi, last_error, lib

# ---- the functions whose files are corrupted ---------------------------------------


def _rand(*shape, seed=0):
    x = mx.random.normal(shape, key=mx.random.key(seed))
    mx.eval(x)
    return x


def _bases() -> dict:
    """name -> (function, example inputs): the node kinds the checks cover, and some they do not."""
    w = _rand(8, 6, seed=7)
    table = mx.arange(40, dtype=mx.float32).reshape(10, 4)
    idx = mx.array([3, 1, 4, 1], dtype=mx.int32)
    def updated(x):
        y = x * 2
        y[1:3] = mx.ones((2, 5))  # SliceUpdate
        start = mx.array([2, 1])
        return mx.slice_update(y, mx.zeros((1, 2)), start, axes=(0, 1)), mx.slice(y, start[1:], (1,), (4, 3))

    return {
        "updated": (updated, (_rand(4, 5),)),
        "elementwise": (lambda x, y: mx.sin(x) * 2.0 + mx.exp(-y * y), (_rand(3, 5), _rand(3, 5, seed=1))),
        "matmul_reduce": (lambda x: (x @ w).sum(axis=1), (_rand(4, 8),)),
        "several": (lambda x, y: (x @ y, mx.max(x @ y, axis=0), (x @ y > 0).astype(mx.int32)),
                    (_rand(4, 8), _rand(8, 6, seed=1))),
        "mlp": (lambda x: mx.softmax(mx.maximum(x @ w + 1.0, 0.0) @ w.T, axis=-1), (_rand(2, 8),)),
        "gather": (lambda x: mx.take(table, idx, axis=0) * x, (_rand(4, 4),)),
        "shapes": (lambda x: mx.concatenate([x.T.reshape(2, 6), x[1:, ::2].reshape(2, 2) @ mx.ones((2, 6))],
                                            axis=0).cumsum(axis=1), (_rand(3, 4),)),
        "sort_pad": (lambda x: mx.pad(mx.sort(x, axis=-1), [(1, 0), (0, 2)]).argmax(axis=0), (_rand(3, 5),)),
        "conv": (lambda x: mx.conv1d(x, mx.ones((2, 3, 4))), (_rand(1, 8, 4),)),
        "along_axis": (lambda x: mx.put_along_axis(x, mx.array([[1], [0]]), mx.take_along_axis(x, idx[:2, None], 1),
                                                   axis=1), (_rand(2, 5),)),
        "split_update": (lambda x: mx.split(x, [1, 3], axis=1)[1] + x[:, 1:3], (_rand(4, 5),)),
        "fast": (lambda x: mx.fast.rms_norm(mx.fast.rope(x, 4, traditional=False, base=10000.0, scale=1.0,
                                                         offset=2), mx.ones(4), 1e-5), (_rand(1, 3, 4),)),
        "quantized": (lambda x: mx.quantized_matmul(x, *mx.quantize(_rand(32, 64, seed=3)), group_size=64),
                      (_rand(2, 64),)),
    }


# Exported shapeless too: MLX then derives each node's shape at every call.
_SHAPELESS = ("elementwise", "matmul_reduce", "several", "mlp")


def _files() -> dict:
    """file name -> (base, shapeless)."""
    files = {name: (name, False) for name in _bases()}
    files.update({f"{name}-shapeless": (name, True) for name in _SHAPELESS})
    return files


# ---- mutations ---------------------------------------------------------------------

_FIELDS = [0, 1, 2, 3, 7, 255, 2**15, 2**31 - 1, 2**32 - 1, 2**63 - 1, -1, -2, -(2**31)]


def corrupt(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One seeded corruption of an export file, and what it was."""
    b = bytearray(data)
    kind = rng.choice(["bit", "bit", "bytes", "field32", "field64", "truncate", "cut", "repeat"])
    at = rng.randrange(len(b))
    if kind == "bit":
        b[at] ^= 1 << rng.randrange(8)
    elif kind == "bytes":
        for k in range(rng.randint(1, 8)):
            b[(at + k) % len(b)] = rng.randrange(256)
    elif kind in ("field32", "field64"):
        width = 4 if kind == "field32" else 8
        at -= at % width
        value = rng.choice(_FIELDS) & ((1 << 8 * width) - 1)
        b[at:at + width] = value.to_bytes(width, "little")[: len(b) - at]
    elif kind == "truncate":
        del b[at:]
    elif kind == "cut":
        del b[at:at + rng.randint(1, 64)]
    else:
        chunk = b[at:at + rng.randint(1, 64)]
        b[at:at] = chunk
    return bytes(b), f"{kind}@{at}"


# ---- the child: load and replay each case, one line per outcome ------------------------


def _child(directory: str, start: int) -> None:
    with open(os.path.join(directory, "cases.json")) as f:
        cases = json.load(f)
    bases = _bases()

    async def main() -> None:
        async with ea.Runtime(pool_size=1) as rt:
            q = rt.default_queue()
            want = {}
            for name, (base, _) in _files().items():
                f = ea.load_traced(os.path.join(directory, f"{name}.mlxfn"))
                want[name] = _bytes(await f(*bases[base][1], queue=q))
                f.release()
            for i in range(start, len(cases)):
                base, path = cases[i]["base"], cases[i]["path"]
                print(f"START {i}", flush=True)
                try:
                    f = ea.load_traced(path)
                except Exception as exc:  # noqa: BLE001 - the outcome being measured
                    _say(i, "refused", exc)
                    continue
                try:
                    got = _bytes(await asyncio.wait_for(f(*bases[_files()[base][0]][1], queue=q), 20))
                except Exception as exc:  # noqa: BLE001
                    _say(i, "failed", exc)
                else:
                    _say(i, "same" if got == want[base] else "different", None)
                finally:
                    f.release()

    asyncio.run(main())
    print("END", flush=True)


def _bytes(out) -> bytes:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return b"".join(bytes(memoryview(o)) + str((o.shape, o.dtype)).encode() for o in outs)


def _say(i: int, outcome: str, exc: BaseException | None) -> None:
    detail = "" if exc is None else f"{type(exc).__name__}: {str(exc)[:200]}"
    print("RESULT " + json.dumps([i, outcome, detail]), flush=True)


# ---- the parent: write the cases, run children until every case has an outcome ----------


def write_cases(directory: str, n: int, seed: int) -> list[dict]:
    bases = _bases()
    data = {}
    for name, (base, shapeless) in _files().items():
        fn, inputs = bases[base]
        path = os.path.join(directory, f"{name}.mlxfn")
        mx.export_function(path, fn, *inputs, shapeless=shapeless)
        with open(path, "rb") as f:
            data[name] = f.read()
    names = sorted(data)
    cases = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        base = names[i % len(names)]
        corrupted, how = corrupt(data[base], rng)
        path = os.path.join(directory, f"case{i}.mlxfn")
        with open(path, "wb") as f:
            f.write(corrupted)
        cases.append({"base": base, "path": path, "how": how})
    with open(os.path.join(directory, "cases.json"), "w") as f:
        json.dump(cases, f)
    return cases


def run_cases(directory: str, cases: list[dict], case_timeout: float = 30.0) -> dict[int, tuple[str, str]]:
    """Every case's (outcome, detail); a child that dies or hangs marks its case and the next child goes on."""
    outcomes: dict[int, tuple[str, str]] = {}
    start = 0
    while start < len(cases):
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", directory, str(start)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        current, ended, buffer = None, False, b""
        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + case_timeout + 30  # the first case also waits for the child's start
        try:
            while True:
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    child.kill()
                    break
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in map(bytes.decode, lines):
                    if line.startswith("START "):
                        current = int(line.split()[1])
                        deadline = time.monotonic() + case_timeout
                    elif line.startswith("RESULT "):
                        i, outcome, detail = json.loads(line[len("RESULT "):])
                        outcomes[i] = (outcome, detail)
                        current = None
                    elif line == "END":
                        ended = True
        finally:
            selector.close()
            child.stdout.close()
            code = child.wait()
            errors = child.stderr.read().decode(errors="replace")
            child.stderr.close()
        if ended and code == 0:
            break
        if current is None:
            raise RuntimeError(f"the fuzz child failed outside a case (status {code}): {errors[-2000:]}")
        how = "hang" if code == -signal.SIGKILL else "crash"
        outcomes[current] = (how, f"status {code}: {errors.strip()[-300:]}")
        start = current + 1
    return outcomes


def fuzz(n: int, seed: int) -> tuple[Counter, dict[int, tuple[str, str]], list[dict]]:
    with tempfile.TemporaryDirectory(prefix="emlx-fuzz-files-") as directory:
        cases = write_cases(directory, n, seed)
        outcomes = run_cases(directory, cases)
    return Counter(outcome for outcome, _ in outcomes.values()), outcomes, cases


# ---- tests -------------------------------------------------------------------------


@pytest.fixture
def several_traces(tmp_path):
    """A file of two traces (mx.exporter), as the replay misuse reports used."""
    path = str(tmp_path / "multi.mlxfn")
    with mx.exporter(path, lambda *a: [sum(a), a[0] * 2]) as ex:
        ex(mx.ones((3,)))
        ex(mx.ones((3,)), mx.ones((3,)))
    return path


def test_a_file_of_several_traces_knows_each_one(several_traces):
    f = ea.load_traced(several_traces)
    assert f.traces == [([((3,), mx.float32)], 2), ([((3,), mx.float32), ((3,), mx.float32)], 2)]
    assert f.n_outputs == 2 and f.input_specs is None

    async def calls():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            one = await f(mx.ones((3,)), queue=q)
            two = await f(mx.ones((3,)), mx.full((3,), 2.0), queue=q)
            with pytest.raises(ea.MLXValueError, match="match none of the function's 2 traces"):
                await f(mx.ones((4,)), queue=q)
            return one, two

    one, two = asyncio.run(calls())
    assert [x.tolist() for x in one] == [[1.0] * 3, [2.0] * 3]
    assert [x.tolist() for x in two] == [[3.0] * 3, [2.0] * 3]
    f.release()


@pytest.mark.parametrize("returned", [(-1,), (5,), (0, 2)])
def test_returned_indices_out_of_range_are_refused(several_traces, returned):
    f = ea.load_traced(several_traces)
    with pytest.raises(ValueError, match="do not exist"):
        f.chain({0: 1}, returned=returned)  # was a segfault (-1) or a lost drain (5)
    # The shim checks them too, whatever Python let through.
    out = ffi.new("int64_t *")
    status = lib.emlx_replay_chain(f._id, ffi.new("int[]", [0]), ffi.new("int[]", [1]), 1,
                                   ffi.new("int[]", list(returned)), len(returned), out)
    assert status != 0 and "does not exist" in last_error()
    f.release()


@pytest.mark.parametrize("donate", [{0: 50}, {0: -3}, {3: 0}])
def test_donation_indices_out_of_range_are_refused_and_the_array_stays(several_traces, donate):
    f = ea.load_traced(several_traces)
    x = mx.array([1.0, 2.0, 3.0])

    async def call():
        async with ea.Runtime() as rt:
            with pytest.raises(ValueError, match="does not exist"):
                await f(x, donate=donate, queue=rt.default_queue())

    asyncio.run(call())
    assert x.tolist() == [1.0, 2.0, 3.0]  # not replaced by a 0-d scalar
    f.release()


def test_each_call_checks_its_indices_against_the_trace_it_matches(tmp_path):
    """Traces of different output counts: an index valid for one is checked per call in the shim."""
    path = str(tmp_path / "uneven.mlxfn")
    with mx.exporter(path, lambda *a: [a[0] + 1] if len(a) == 1 else [a[0], a[1] * 3]) as ex:
        ex(mx.ones((2,)))
        ex(mx.ones((2,)), mx.ones((2,)))
    f = ea.load_traced(path)
    assert f.n_outputs == 0 and [n for _, n in f.traces] == [1, 2]
    with pytest.raises(ValueError, match="do not exist"):
        f.chain({0: 0}, returned=(1,))  # trace 0 has no output 1
    out = ffi.new("int64_t *")
    ints = lambda *v: ffi.new("int[]", list(v))  # noqa: E731
    assert lib.emlx_replay_chain(f._id, ints(0), ints(0), 1, ints(1), 1, out) != 0  # the same in the shim
    chained = f.chain({0: 0}, returned=(0,))

    async def calls():
        async with ea.Runtime() as rt:
            q = rt.default_queue()
            got = await chained(mx.ones((2,)), mx.full((2,), 5.0), queue=q)
            await q.run(ea.replay.end_chain_here)
            return got

    assert asyncio.run(calls()).tolist() == [1.0, 1.0]
    chained.release()
    f.release()


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.mlxfn"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(ea.MLXValueError, match="not a regular file"):
        ea.load_traced(fifo)  # opened without a writer, a FIFO blocked for ever
    assert time.monotonic() - started < 5
    with pytest.raises(FileNotFoundError):
        ea.load_traced(tmp_path / "missing.mlxfn")


def test_a_directory_is_refused_by_name_and_its_descriptor_closed(tmp_path):
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no listing of this process's descriptors")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):  # each refusal left a descriptor open
        with pytest.raises(ea.MLXValueError, match="is not a regular file"):
            ea.load_traced(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


def test_our_files_carry_a_digest_that_loading_checks(tmp_path):
    path = tmp_path / "sealed.mlxfn"
    x = mx.arange(6, dtype=mx.float32).reshape(2, 3)

    async def traced():
        async with ea.Runtime() as rt:
            f = await ea.trace(lambda a: a * 2 + 1, x, queue=rt.default_queue(), save=path)
            f.release()

    asyncio.run(traced())
    data = path.read_bytes()
    seal = b"\0emlx-async-sha256\0"
    assert data[-32 - len(seal):-32] == seal
    assert mx.import_function(str(path))(x)[0].tolist() == (x * 2 + 1).tolist()  # plain MLX reads it too
    ea.load_traced(path).release()
    refused = Counter()
    for i in range(40):  # every corruption, even of a constant's value, is caught
        corrupted, _ = corrupt(data, random.Random(i))
        if corrupted == data:
            continue
        path.write_bytes(corrupted)
        with pytest.raises(ea.MLXValueError) as caught:
            ea.load_traced(path)
        refused["digest" if "integrity record" in str(caught.value) else "other"] += 1
    assert refused["digest"] > 30, refused


def _patched_indices(path, fn, x, idx) -> tuple[bytes, bytes]:
    """The export of fn(x) with its constant indices `idx` (int32) patched far out of range, and unpatched."""
    mx.export_function(str(path), fn, x)
    data = path.read_bytes()
    pattern = b"".join(int(i).to_bytes(4, "little") for i in idx.flatten().tolist())
    assert data.count(pattern) == 1
    return data.replace(pattern, (10**9).to_bytes(4, "little") * idx.size), data


def test_constant_indices_out_of_range_are_refused(tmp_path):
    idx = mx.array([[3], [1]], dtype=mx.int32)
    x = mx.arange(10, dtype=mx.float32).reshape(2, 5)
    path = tmp_path / "along.mlxfn"
    patched, _ = _patched_indices(path, lambda a: mx.take_along_axis(a, idx, axis=1), x, idx)
    path.write_bytes(patched)
    with pytest.raises(ea.MLXValueError, match="GatherAxis node reads a constant index outside its operand"):
        ea.load_traced(path)  # its kernel read 4 GB past its input
    take = mx.array([3, 1], dtype=mx.int32)
    patched, _ = _patched_indices(path, lambda a: mx.take(a, take, axis=1), x, take)
    path.write_bytes(patched)
    with pytest.raises(ea.MLXValueError, match="Gather node reads a constant index outside its operand"):
        ea.load_traced(path)
    start = mx.array([13], dtype=mx.int32)
    patched, _ = _patched_indices(path, lambda a: mx.slice(a, start, (0,), (2,)), mx.arange(20.0), start)
    path.write_bytes(patched)
    with pytest.raises(ea.MLXValueError, match="DynamicSlice node starts at a constant offset outside"):
        ea.load_traced(path)  # its kernel read 4 GB past its input (SIGSEGV)


def _split_indices_patched(data: bytes, indices: list[int]) -> bytes:
    """`data` with the indices of its one Split node (after its name and count) replaced."""
    at = data.index(b"Split") + len(b"Split")
    assert data.count(b"Split") == 1 and int.from_bytes(data[at:at + 8], "little") == len(indices)
    patched = b"".join(i.to_bytes(4, "little", signed=True) for i in indices)
    return data[:at + 8] + patched + data[at + 8 + len(patched):]


@pytest.mark.parametrize("indices", [[1, 10**6], [-(10**6), 3], [3, 1], [1, 6]])
def test_split_indices_outside_the_axis_are_refused(tmp_path, indices):
    # Its kernel makes views at those offsets: a seeded fuzz (seed 17) patched
    # them and the replay read far outside the input (SIGSEGV).
    path = tmp_path / "split.mlxfn"
    mx.export_function(str(path), lambda a: mx.split(a, [1, 3], axis=1)[1] + 1, mx.ones((4, 5)))
    data = path.read_bytes()
    ea.load_traced(path).release()
    path.write_bytes(_split_indices_patched(data, indices))
    with pytest.raises(ea.MLXValueError, match="Split node splits at indices out of order or outside its axis"):
        ea.load_traced(path)


_CONVOLUTIONS = {
    "conv1d": (lambda x: mx.conv1d(x, mx.ones((2, 3, 4)), stride=2, padding=1, dilation=2), (1, 9, 4)),
    "conv2d": (lambda x: mx.conv2d(x, mx.ones((2, 3, 3, 4)), stride=2, padding=1), (1, 8, 8, 4)),
    "grouped": (lambda x: mx.conv2d(x, mx.ones((4, 3, 3, 2)), groups=2), (1, 6, 6, 4)),
    "transposed": (lambda x: mx.conv_transpose2d(x, mx.ones((2, 3, 3, 4)), stride=2, padding=1), (1, 5, 5, 4)),
    "conv3d": (lambda x: mx.conv3d(x, mx.ones((2, 2, 2, 2, 3)), stride=(1, 2, 1)), (1, 4, 5, 3, 3)),
    # an empty input: its output is the padding's (the first version of the check refused the file)
    "empty input": (lambda x: mx.conv1d(x, mx.ones((3, 1, 4)), padding=2), (1, 0, 4)),
}


@pytest.mark.parametrize("name", sorted(_CONVOLUTIONS))
def test_convolution_strides_that_do_not_give_its_output_are_refused(tmp_path, name):
    # A seeded fuzz (its conv2d, seed 3) flipped a bit of a stride: the kernel
    # read the input at output position times 2097154 (SIGSEGV).
    fn, shape = _CONVOLUTIONS[name]
    x = _rand(*shape)
    path = tmp_path / f"{name}.mlxfn"
    mx.export_function(str(path), fn, x)
    data = path.read_bytes()
    f = ea.load_traced(path)  # the files MLX writes pass
    assert _bytes(asyncio.run(_replay(f, x))) == _bytes(fn(x))
    f.release()
    at = data.index(b"Convolution") + len(b"Convolution") + 8  # the strides, after their count
    stride = int.from_bytes(data[at:at + 4], "little")
    path.write_bytes(data[:at] + (stride | 1 << 21).to_bytes(4, "little") + data[at + 4:])
    with pytest.raises(ea.MLXValueError, match="Convolution node makes another spatial size"):
        ea.load_traced(path)


async def _replay(f, *xs):
    async with ea.Runtime(pool_size=1) as rt:
        return await f(*xs, queue=rt.default_queue())


def test_verify_replays_a_foreign_file_in_a_child_first(tmp_path):
    # A scatter's constant indices are not checked (documented): patched far
    # out of range, the file passes every check, and its kernel writes past
    # its output. verify=True finds that out in a process that may die.
    path = tmp_path / "scatter.mlxfn"
    idx = mx.array([3, 1], dtype=mx.int32)
    x = mx.arange(10, dtype=mx.float32).reshape(5, 2)
    patched, data = _patched_indices(path, lambda a: a.at[idx].add(1.0), x, idx)
    f = ea.load_traced(path, verify=True)
    assert f.traces == [([((5, 2), mx.float32)], 1)]
    f.release()
    path.write_bytes(patched)
    with pytest.raises(ea.MLXValueError, match="verifying .* killed by SIG"):
        ea.load_traced(path, verify=True)
    # A file the checks refuse is refused with their message, as without verify.
    path.write_bytes(data[:-7])
    with pytest.raises(ea.MLXValueError, match=r"^\[load_traced\] a count in .* exceeds what the file holds"):
        ea.load_traced(path, verify=True)




def test_corrupted_export_files_never_kill_or_hang_the_process():
    """Seeded corruptions of foreign files (no digest): refused, or replayed by a process that lives."""
    n = int(os.environ.get("EMLX_FUZZ_FILES", "96"))
    counts, outcomes, cases = fuzz(n, int(os.environ.get("EMLX_FUZZ_SEED", "0")))
    assert sum(counts.values()) == n
    dead = {i: (cases[i]["base"], cases[i]["how"], *outcomes[i]) for i in outcomes
            if outcomes[i][0] in ("crash", "hang")}
    assert not dead, dead
    assert counts["refused"] > n // 2, counts  # most corruptions are caught before MLX reads the file


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("DIR", "START"), help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
    else:
        counts, outcomes, cases = fuzz(args.cases, args.seed)
        print(json.dumps(dict(counts), sort_keys=True))
        for i, (outcome, detail) in sorted(outcomes.items()):
            if outcome in ("crash", "hang", "different"):
                print(i, cases[i]["base"], cases[i]["how"], outcome, detail[:200])
