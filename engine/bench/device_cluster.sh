#!/bin/bash
# Split-K GEMVs as thread block clusters (decode_gemv.cu CLUSTER_OK: compiled in with -DGEMV_CLUSTER=1, launched so with
# DEEPINFER_GEMV_CLUSTER=1 | lb | spread | pairs) in one device call (carry [".whl"]): the cluster test (bits equal to
# the handshake's), the decode kernels' reference checks with it on, then the step replay A/B against the default build
# (tokens compared) and the 3B's trace of both.
#   bash engine/bench/device_cluster.sh COMMIT   -> $OUT/pytest_cluster.txt, decode_ab_cluster.json, gemv_phases_*
# The thirty-fifth session's second call timed lb, pairs (the same -D) against base in the same way.
set -u
. engine/bench/device_env.sh
D="DEEPINFER_KERNEL_DEFINES=-DGEMV_CLUSTER=1"
env "$D" DEEPINFER_GEMV_CLUSTER=1 timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gemv_cluster.py tests/test_gpu_decode.py::test_decode_kernels_match_references \
    tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references > "$OUT/pytest_cluster.txt" 2>&1
echo "checks: $(tail -1 "$OUT/pytest_cluster.txt")"
TAG=${TAG:-cluster} ABV=${ABV:-"base:,cl:$D+DEEPINFER_GEMV_CLUSTER=1,lb:$D+DEEPINFER_GEMV_CLUSTER=lb,base2:,lb2:$D+DEEPINFER_GEMV_CLUSTER=lb"} \
    SHAPES=${SHAPES:-3b:4,7b:4,14b:4} ROUNDS=${ROUNDS:-2} TRACE=${TRACE-"base:,lb:$D+DEEPINFER_GEMV_CLUSTER=lb"} \
    TRACE_OPS=${TRACE_OPS:-"(down|qkv)"} bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
