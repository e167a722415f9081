"""How long a GGUF takes to repack in each packing (EngineConfig.gguf_pack), on the CPU side of a load (no GPU: the
layers are repacked by gpu_load.load_source's worker threads into CPU tensors), and the bytes each gives.

    python -m engine.bench.gguf_pack_load --model r3b.gguf [--rounds 2] --out docs/results/gguf_pack_load_cpu.json

(`deepinfer make-random --shape 3b --format gguf --out r3b.gguf` makes a random Q4_K_M of the 3B shape.) Modes are
interleaved round by round, so the page cache and the allocator warm up for all of them alike.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from engine.bench.envinfo import emit_json, environment
from engine.config import GGUF_PACKS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a quantized .gguf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from engine.formats.gguf_reader import read_gguf
    from engine.model import gpu_load

    spec = read_gguf(a.model)
    res = {"model": os.path.basename(a.model), "cpus": os.cpu_count(), "rounds": a.rounds, "seconds": {},
           "weight_bytes": {}}
    for r in range(a.rounds):
        for mode in GGUF_PACKS:
            t0 = time.perf_counter()
            w = gpu_load.load_source(spec, "cpu", mode=mode)
            dt = time.perf_counter() - t0
            res["seconds"].setdefault(mode, []).append(round(dt, 2))
            res["weight_bytes"][mode] = w.nbytes()
            print(f"round {r + 1} {mode:7s} {dt:6.2f} s  {w.nbytes() / 1e9:.3f} GB", flush=True)
            del w
    res["environment"] = environment()
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
