#!/bin/bash
# Split-K GEMVs as thread block clusters (DEEPINFER_GEMV_CLUSTER=1, decode_gemv.cu CLUSTER_OK) in one device call
# (carry [".whl"]): the cluster test (bits equal to the handshake's), the decode kernels' reference checks with it on,
# then the step replay A/B (tokens compared) and the 3B's trace of both.
#   bash engine/bench/device_cluster.sh COMMIT   -> $OUT/pytest_cluster.txt, decode_ab_cluster.json, gemv_phases_*
set -u
. engine/bench/device_env.sh
DEEPINFER_GEMV_CLUSTER=1 timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_cluster.py \
    tests/test_gpu_decode.py::test_decode_kernels_match_references \
    tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references > "$OUT/pytest_cluster.txt" 2>&1
echo "checks: $(tail -1 "$OUT/pytest_cluster.txt")"
DEEPINFER_KERNEL_DEFINES=-DGEMV_CLUSTER_B0WAIT=0 timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gemv_cluster.py >> "$OUT/pytest_cluster.txt" 2>&1
echo "checks, K slice 0 arriving only: $(tail -1 "$OUT/pytest_cluster.txt")"
TAG=${TAG:-cluster} ABV=${ABV:-"base:,cl:DEEPINFER_GEMV_CLUSTER=1,clnw:DEEPINFER_GEMV_CLUSTER=1+DEEPINFER_KERNEL_DEFINES=-DGEMV_CLUSTER_B0WAIT=0,base2:,cl2:DEEPINFER_GEMV_CLUSTER=1"}
# (the thirty-fifth session's second call: ABV="base:,lb:DEEPINFER_GEMV_CLUSTER=lb,spread:DEEPINFER_GEMV_CLUSTER=spread,
#  pairs:DEEPINFER_GEMV_CLUSTER=pairs,base2:,pairs2:DEEPINFER_GEMV_CLUSTER=pairs" TRACE="lb:DEEPINFER_GEMV_CLUSTER=lb") \
    SHAPES=${SHAPES:-3b:4,7b:4,14b:4} ROUNDS=${ROUNDS:-2} TRACE=${TRACE-"base:,cl:DEEPINFER_GEMV_CLUSTER=1"} \
    TRACE_OPS=${TRACE_OPS:-"(down|qkv)"} bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
