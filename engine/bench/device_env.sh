#!/bin/bash
# Sourced by the device scripts (". engine/bench/device_env.sh"): the carried wheels (.whl, carry [".whl"]) installed
# once per machine into /tmp/site, PYTHONPATH set, the GPU's name printed.
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name --format=csv,noheader
