"""The Qwen2 forward, written once over an ops object. Every path runs this function:

  CPU runner            kernels.ops_reference.RefOps           (plain PyTorch, rows of [B, T], fp32 KV)
  GPU decode step       engine.model.ops_step.StepOps          (kernels/decode_*.cu or their references;
                                                                 captured in a CUDA graph)
  GPU prefill           engine.model.ops_prefill.PrefillOps    (Triton elementwise + dequant/cuBLAS linears,
                                                                 or plain torch; eager or in a graph)
  benches and checks    the same ops (engine/bench/prefill_model.py, tests/gpu_checks.py)
  GPTQ calibration      layer() on RefOps with Hessian-recording linears (engine/quant/calibrate.py)

The ops interface (h: residual stream, x: normed activations, y: a linear's output):
  embed(w_embed) -> h                 embedding rows of the ops' tokens
  add_norm(h, y, weight) -> x         h += y (y None: nothing to add), x = rmsnorm(h) * weight
  linear(w, x, epi, h) -> y           the epilogue is part of the op:
                                        "store"  y = x @ W.T + b
                                        "silu"   W = gate|up rows, y = silu(gate) * up
                                        "resid"  an addend of h: the op adds it into h itself and returns
                                                 None (decode GEMV), or returns it for add_norm to add
                                                 (prefill's fused add+rmsnorm)
  attention(i, qkv) -> a              layer i: rope on q/k, K/V written to the cache, causal GQA
  logits(x, head) -> logits           final rows through the head (greedy argmax where the ops fuse it)
Dense vs quantized linears are the weight's business: each ops object dispatches on the weight's
type in one place (its linear), never here.
"""
from __future__ import annotations


def layer(ops, i: int, L, h, x, next_norm):
    """Decoder layer i: x = its input norm of the residual h -> next_norm of h after the layer (h updated).
    rmsnorm'd x -> qkv -> attention -> o (+h) -> rmsnorm -> gate_up (silu*mul) -> down (+h) -> next norm;
    each norm is fused with the residual add before it (the next layer's input norm closes a layer)."""
    a = ops.attention(i, ops.linear(L.qkv, x, "store", h))
    x = ops.add_norm(h, ops.linear(L.o, a, "resid", h), L.post_norm)
    d = ops.linear(L.down, ops.linear(L.gate_up, x, "silu", h), "resid", h)
    return ops.add_norm(h, d, next_norm)


def forward(ops, w):
    """w: .embed, .layers (engine.model.layout.LayerWeights), .norm, .lm_head -> ops.logits(...)."""
    n = len(w.layers)
    h = ops.embed(w.embed)
    x = ops.add_norm(h, None, w.layers[0].in_norm)
    for i, L in enumerate(w.layers):
        x = layer(ops, i, L, h, x, w.layers[i + 1].in_norm if i + 1 < n else w.norm)
    return ops.logits(x, w.lm_head)
