#!/bin/bash
# commlib on a real GPU: the NCCL paths the CPU suite can only simulate.
#
# For a lent GPU machine (one GPU: NCCL takes one rank per device, so world 1),
# from the repository root, with the machine's own torch:
#   bash benchmarks/gpu_check.sh            # logs and tables under $OUT (or /tmp/gpu_check)
# It installs commlib without dependencies (editable, else the wheel carried in
# .whl/), then runs tests/gpu (collectives, lanes and streams, checked calls,
# objects, DDP on commlib-nccl), the nccl engine tests, the conformance kit on
# nccl at world 1, commlib's bench against torch on real NCCL (checked and
# unchecked) and the dispatch benchmark with the real nccl plugin class.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
{ $PY -m pip install -q --no-deps --no-build-isolation -e . ||
  $PY -m pip install -q --no-deps --no-index .whl/commlib-*.whl; } >"$OUT/install.log" 2>&1 ||
  echo "install failed: see install.log"
export PYTHONPATH=$PWD
nvidia-smi -L
$PY -c 'import torch, commlib, commlib_backends; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(), "commlib", commlib.__file__)'
step() { echo "=== $1 ($(date +%T))"; }
step "tests/gpu + nccl engine"
timeout 170 $PY -X faulthandler -m pytest tests/gpu tests/backends/test_nccl_engine.py -q -rs 2>&1 |
  tee "$OUT/gpu_tests.log" | tail -40
echo "pytest exit: ${PIPESTATUS[0]}"
step "conformance kit, nccl, world 1"
timeout 150 $PY -m pytest --commlib-backend nccl --commlib-world-sizes 1 \
  -m commlib_conformance -q -rf 2>&1 | tee "$OUT/kit.log" | tail -30
step "bench: commlib vs torch on real NCCL, checked and unchecked"
# world 1 as a launched rank: torch's elastic launcher (commlib bench's own) needs torch >= 2.12
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
timeout 120 $PY -m commlib bench --nproc 1 --backend nccl --strict both --ops tensor,latency \
  --max-bytes 64M --trials 5 --iters 50 --format markdown --no-progress --no-memory \
  --json "$OUT/bench_nccl.json" 2>&1 | tee "$OUT/bench_nccl.md" | tail -40
step "dispatch: the real nccl plugin class on torch's fake group of 8"
timeout 80 $PY -m commlib bench --ops dispatch --backend nccl --nproc 8 --trials 7 \
  --format markdown --no-progress 2>&1 | tee "$OUT/dispatch_nccl.md" | tail -30
step "done"
