#!/bin/bash
# On the device: join a real model's parts (carried over earlier calls into /tmp/parts/<prefix>*, at most ~30 MB
# each: one call carries 64 MiB with the tree) into the model cache $DEEPINFER_MODELS (default /tmp/store) and
# check its sha256, as `deepinfer pull` would have.   device_join.sh FILE.gguf SHA256 PREFIX
set -eu
store=${DEEPINFER_MODELS:-/tmp/store}
mkdir -p "$store"
cat /tmp/parts/"$3"* > "$store/$1"
got=$(sha256sum "$store/$1" | cut -d' ' -f1)
[ "$got" = "$2" ] || { echo "sha256 mismatch for $1: $got" >&2; exit 1; }
echo "$got" > "$store/${1%.gguf}.verified"
echo "joined $1 ($(stat -c %s "$store/$1") bytes, sha256 ok)"
