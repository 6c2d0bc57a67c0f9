#!/usr/bin/env bash
# The GPU checks, in one call on a GPU machine that has torch, numpy, pyarrow, safetensors and
# pytest but not this project's other dependencies: the CUDA tests (learners, batching, the
# store), then `bench/learners.py --device cuda`. Records and the logs go to $OUT (or
# ./gpu-out) as one archive.
#
#   OFFMETA_GIT_REVISION=$(git rev-parse HEAD) bash bench/gpu_checks.sh [WHEELS_DIR]
#
# WHEELS_DIR (default .whl) holds wheels of what the machine lacks (pydantic and its
# dependencies, boto3 and its dependencies), installed into /tmp/site without an index.
set -uo pipefail
out=${OUT:-gpu-out}
wheels=${1:-.whl}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$wheels"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
status=0
python3 -m pytest -p no:cacheprovider -q -o addopts="" tests/test_cuda.py \
    tests/pipeline/streams/test_collate.py 2>&1 | tee "$out/tests.log" || status=1
python3 bench/learners.py --device cuda --shapes "${SHAPES:-sinusoid,large,one-task}" 2>&1 \
    | tee "$out/bench.log" || status=1
python3 bench/learners.py --device cuda --float32-matmul tf32 --shapes "${TF32_SHAPES:-large}" \
    2>&1 | tee -a "$out/bench.log" || status=1
tar -czf "$out/records.tgz" bench/results
exit $status
