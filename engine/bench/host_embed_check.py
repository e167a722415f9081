"""Device check of the host-RAM embedding: a 7B-shape model (4 layers, random W4 weights) gives the same
prefill logits and the same 16 greedy decode steps with the embedding staged from host RAM as with the
embed_rows kernel, at batch 1 and 3, in CUDA graphs.  python -m engine.bench.host_embed_check"""
from __future__ import annotations

import dataclasses
import json
import sys

import torch

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel


def run(embed_on_host: bool) -> tuple[list[torch.Tensor], list[list[int]]]:
    cfg = dataclasses.replace(ModelConfig(**QWEN25_SHAPES["7b"]), num_layers=4)
    m = GPUModel(random_weights(cfg, 4, torch.device("cuda"), seed=5, embed_on_host=embed_on_host), 4, 1024)
    logits, toks = [], []
    for s, n in enumerate((48, 300, 7)):
        lg = m.prefill(list(range(1000 + s, 1000 + s + n)), s, 0)
        logits.append(lg.float().cpu())
        toks.append([int(lg.argmax())])
    lens = [48, 300, 7]
    for i in range(16):
        B = 1 if i < 8 else 3
        ids, lg = m.decode([t[-1] for t in toks[:B]], [n + i for n in lens[:B]], list(range(B)))
        for b in range(B):
            toks[b].append(ids[b])
        logits.append(lg[:B].float().cpu())
    return logits, toks


def main() -> int:
    a_l, a_t = run(False)
    b_l, b_t = run(True)
    err = max(float((x - y).norm() / y.norm()) for x, y in zip(b_l, a_l))
    out = {"max_rel_err": err, "tokens_equal": a_t == b_t, "ok": err < 1e-5 and a_t == b_t}
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
