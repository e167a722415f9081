#!/bin/bash
# Here (a machine with PyPI), in the repository root: the wheels the device machine lacks (its image has torch, CuPy,
# Triton, numpy, tokenizers, safetensors, jinja2, httpx, huggingface-hub, pytest; not these) into .whl/
# (git-ignored), for Python 3.12 manylinux x86_64. Each device call that needs them carries ".whl" and starts with
#   [ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#       --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
# (the engine/bench/device_*.sh scripts do). ~10 MB in all: well inside one call's 64 MiB.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .whl
plat=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  plat="$plat --platform $p"
done
# the versions CI resolves (pinned: each latest alone need not fit the others), with what they need beyond the image
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d .whl \
    gguf==0.19.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    annotated-doc==0.0.7 typing-inspection==0.4.5 opentelemetry-api==1.45.3 uvicorn==0.55.0 platformdirs==4.14.9 \
    llguidance==1.9.1 openai==3.63.0 httpx2==2.17.0 httpcore2==2.17.0 truststore idna==3.20 distro==1.9.0 \
    jiter==0.19.0 sniffio==1.3.1 anyio==4.16.0 h11==0.16.0 typing-extensions==4.16.0
ls .whl | sed 's/^/  /'
du -sh .whl
