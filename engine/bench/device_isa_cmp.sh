#!/bin/bash
# On the device, one call after device_isa.sh: where the step's time goes now (step_trace at 64 and 16k cached rows)
# and the tree before the change against this one (compare_trees on a random 3B W4; .before = `git archive <sha>
# engine kernels assets`, carried). Writes $OUT/step_trace_<TAG>_h200.json, $OUT/step_trace_16k_<TAG>_h200.json,
# $OUT/session_speed_h200_<TAG>.json.
#   TAG=isa bash engine/bench/device_isa_cmp.sh COMMIT     (carry .whl and .before)
set -u
tag=${TAG:-run}
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
timeout 150 python3 -m engine.bench.step_trace --shapes "${TRACE:-3b:4,7b:4}" --commit "${1:-unknown}" \
    --out "$OUT/step_trace_${tag}_h200.json" 2>&1 | grep -E "^\|" | head -30
timeout 90 python3 -m engine.bench.step_trace --shapes 3b:4 --cached 16384 --commit "${1:-unknown}" \
    --out "$OUT/step_trace_16k_${tag}_h200.json" 2>&1 | grep -E "^\|" | head -14
[ -d /tmp/r3b ] || (cd .before && PYTHONPATH=/tmp/site:. python3 -m engine.cli.main make-random --shape 3b \
    --scheme w4 --out /tmp/r3b > /dev/null)
timeout ${CT:-280} python3 -m engine.bench.compare_trees --model /tmp/r3b --tree before=.before --tree after=. \
    --rounds 3 --budget-s ${BUDGET:-150} --work /tmp/cmpw --out "$OUT/session_speed_h200_$tag.json" 2>&1 | tail -8
