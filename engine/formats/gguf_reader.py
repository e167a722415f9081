"""GGUF reader: config from metadata, tokenizer from tokens/merges, dequantized weights.

GGUF stores shapes reversed (a tensor listed as [896, 4864] is a (4864, 896) matrix used as
y = x @ W.T); gguf.quants.dequantize returns the row-major matrix we want.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.formats.gguf_file import GGUFFile
from engine.formats.gguf_layout import hf_name  # GGUF name -> HF name (torch-free, the doctor uses it too)
from engine.formats.spec import ModelSpec
from engine.formats.tokenizer import Tokenizer


def read_gguf(path: str | Path) -> ModelSpec:
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file {path} does not exist", "check the path or run `deepinfer pull`")
    gf = GGUFFile(path)
    meta = gf.fields
    arch = meta.get("general.architecture")
    if arch != "qwen2":
        raise ModelFileError(f"{path.name}: architecture {arch!r} is not supported (only qwen2 / Qwen2.5)",
                             "use a Qwen2.5 GGUF model")
    a = "qwen2."
    n_heads = int(meta.get(a + "attention.head_count"))
    tensors = gf.tensors
    tied = "output.weight" not in tensors
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelFileError(f"{path.name} has no token_embd.weight: incomplete or damaged file")
    cfg = ModelConfig(
        vocab_size=int(emb.shape[1]),
        hidden_size=int(meta.get(a + "embedding_length")),
        intermediate_size=int(meta.get(a + "feed_forward_length")),
        num_layers=int(meta.get(a + "block_count")),
        num_heads=n_heads,
        num_kv_heads=int(meta.get(a + "attention.head_count_kv", n_heads)),
        rope_theta=float(meta.get(a + "rope.freq_base", 1_000_000.0)),
        rms_eps=float(meta.get(a + "attention.layer_norm_rms_epsilon", 1e-6)),
        max_position=int(meta.get(a + "context_length", 32768)),
        tie_word_embeddings=tied,
        bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 151643)),
        eos_token_ids=[int(meta.get("tokenizer.ggml.eos_token_id", 151645))],
    )
    tokenizer = Tokenizer.from_gguf(
        list(meta.get("tokenizer.ggml.tokens")), list(meta.get("tokenizer.ggml.merges")),
        [int(x) for x in meta.get("tokenizer.ggml.token_type")], cfg.eos_token_ids)
    cfg.eos_token_ids = tokenizer.eos_token_ids
    template = meta.get("tokenizer.chat_template")

    names = {}
    for name, t in tensors.items():
        hn = hf_name(name)
        if hn is not None:
            names[hn] = t

    def weights():
        yield from _dequantized(names)

    return ModelSpec(cfg, tokenizer, template, str(path), weights,
                     {hn: t.type_name for hn, t in names.items()}, kind="dense", gguf_tensors=names,
                     reader_weights=weights)


def _dequantized(names: dict):
    """(hf_name, float32 tensor) in the file's order, each a new array (GGUFTensor.dequantize). The dequantization
    is numpy on one core per tensor (it releases the GIL on whole arrays), so the next tensors are decoded by a
    small pool while the consumer places this one: at most `ahead` tensors wait decoded (memory), an error raises
    at its own tensor's turn, and a consumer that stops early leaves only the ones in flight to finish."""
    workers = min(2, os.cpu_count() or 1)
    if workers < 2:
        for hn, t in names.items():
            yield hn, torch.from_numpy(t.dequantize())
        return
    ahead = workers + 1
    items = iter(names.items())
    with ThreadPoolExecutor(workers, thread_name_prefix="gguf-dequant") as pool:
        queued = deque()
        try:
            for hn, t in items:
                queued.append((hn, pool.submit(t.dequantize)))
                if len(queued) >= ahead:
                    break
            while queued:
                hn, fut = queued.popleft()
                nxt = next(items, None)
                if nxt is not None:
                    queued.append((nxt[0], pool.submit(nxt[1].dequantize)))
                yield hn, torch.from_numpy(fut.result())
        finally:  # an error or a consumer that stopped: what has not started is dropped
            for _, f in queued:
                f.cancel()
