#!/bin/bash
# #17 on the device, one call after the real 0.5B's parts (/tmp/parts/PREFIX*, joined here): do a verify step's rows
# part from one-token steps (the deferred rmsnorm's parting, found and fixed: docs/hotpath.md "The parting found")?
# engine/bench/verify_rows.py (plain tokens verified as chains and as trees, K/V and logits bit for bit) by default
# (the deferred norm), with separate norms, and under the knobs that could matter, then the row tests.
#   bash engine/bench/device_parting.sh COMMIT [PREFIX]        (wheels installed, PYTHONPATH=/tmp/site:.)
# RANDOM_MODEL=1: no parts; a random-weight Q4_K_M GGUF of the 0.5B's shape made here, with the real model's bundled heads
# (same hidden size and vocabulary) for the +draft modes.
# Writes $OUT/verify_rows_<variant>.json and .log, $OUT/defer_rows.txt, $OUT/spec_rows_pytest.txt.
set -u
export DEEPINFER_MODELS=/tmp/store
MODEL=(--model qwen2.5-coder-0.5b)
if [ "${RANDOM_MODEL:-0}" = 1 ]; then
    [ -f /tmp/r05.gguf ] || python3 -m engine.cli.main make-random --shape 0.5b --format gguf --out /tmp/r05.gguf \
        > /dev/null 2>&1
    MODEL=(--model /tmp/r05.gguf --heads assets/drafters/qwen2.5-coder-0.5b-instruct-q4_k_m.heads.safetensors)
else
    [ -f /tmp/store/qwen2.5-coder-0.5b-instruct-q4_k_m.verified ] || bash engine/bench/device_join.sh \
        qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
        "${2:-q05_}" || exit 1
fi
run() {  # NAME ENV...: one verify_rows run under the given knobs (VARIANTS="a b": only those names)
    local name=$1; shift
    case " ${VARIANTS:-$name} " in *" $name "*) ;; *) return ;; esac
    env "$@" timeout 150 python3 -m engine.bench.verify_rows "${MODEL[@]}" --tokens "${TOKENS:-96}" \
        --out "$OUT/verify_rows_$name.json" > "$OUT/verify_rows_$name.log" 2>&1
    echo "== $name $*"; grep -E "^(chain|tree|trace)" "$OUT/verify_rows_$name.log" || tail -3 "$OUT/verify_rows_$name.log"
}
run default  # the deferred norm
run separate DEEPINFER_DEFER_NORM=0
run defer_nopdl DEEPINFER_DEFER_NORM=1 DEEPINFER_PDL=0
run defer_noxpred DEEPINFER_DEFER_NORM=1 DEEPINFER_KERNEL_DEFINES=-DGEMV_XPRED=0
run defer_late_scales DEEPINFER_DEFER_NORM=1 DEEPINFER_KERNEL_DEFINES=-DDEFER_EARLY=0
[ -n "${VARIANTS:-}" ] && exit 0  # a short call: the row checks below run in the GPU suite too
timeout 60 python3 -m engine.bench.defer_rows > "$OUT/defer_rows.txt" 2>&1; tail -2 "$OUT/defer_rows.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_spec_verify.py > "$OUT/spec_rows_pytest.txt" 2>&1
tail -3 "$OUT/spec_rows_pytest.txt"
sed -i "s#\"git_commit\": \"[0-9a-f]*\"#\"git_commit\": \"${1:-unknown}\"#" "$OUT"/*.json
