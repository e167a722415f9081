"""The engine's logits against an independent, straightforward float64 Qwen2 forward written here
from the dequantized GGUF weights (no code shared with engine/model/qwen2.py)."""
import torch


def reference_logits(spec, ids: list[int]) -> torch.Tensor:
    c = spec.config
    W = dict(spec.weights())  # HF names, float32
    d = lambda n: W[n].double()  # noqa: E731

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_eps) * w

    T, hd = len(ids), c.head_dim
    pos = torch.arange(T, dtype=torch.float64)
    inv = c.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):  # x [heads, T, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = d("model.embed_tokens.weight")[torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        h = rms(x, d(p + "input_layernorm.weight"))
        q = h @ d(p + "self_attn.q_proj.weight").T + d(p + "self_attn.q_proj.bias")
        k = h @ d(p + "self_attn.k_proj.weight").T + d(p + "self_attn.k_proj.bias")
        v = h @ d(p + "self_attn.v_proj.weight").T + d(p + "self_attn.v_proj.bias")
        q = rope(q.view(T, c.num_heads, hd).transpose(0, 1))
        k = rope(k.view(T, c.num_kv_heads, hd).transpose(0, 1))
        v = v.view(T, c.num_kv_heads, hd).transpose(0, 1)
        rep = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v
        x = x + att.transpose(0, 1).reshape(T, -1) @ d(p + "self_attn.o_proj.weight").T
        h = rms(x, d(p + "post_attention_layernorm.weight"))
        g = h @ d(p + "mlp.gate_proj.weight").T
        u = h @ d(p + "mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(g) * u) @ d(p + "mlp.down_proj.weight").T
    x = rms(x, d("model.norm.weight"))
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"]).double()
    return x @ head.T


def test_logits_match_float64_reference(llm, spec):
    ids = llm.tokenizer.encode("<|im_start|>user\n用一句话解释 CUDA Graph。<|im_end|>\n<|im_start|>assistant\n")
    ref = reference_logits(spec, ids)
    got = llm.runner.logits(ids).double()
    rel = (got - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"relative error {rel:.2e}"
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_chunked_prefill_equals_one_pass(llm):
    from engine.runtime import cpu_runner as runner_mod
    ids = llm.tokenizer.encode("一二三四五六七八九十 " * 12)
    whole = llm.runner.logits(ids)
    old = runner_mod.PREFILL_CHUNK
    runner_mod.PREFILL_CHUNK = 16
    try:
        chunked = llm.runner.logits(ids)
    finally:
        runner_mod.PREFILL_CHUNK = old
    assert (whole - chunked).abs().max() / whole.abs().max() < 1e-5
