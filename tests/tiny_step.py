"""A tiny random checkpoint (vocab 1024, hidden 256, 2 layers, GQA 4:2) and the GPU decode step's GPUModel on it: on
the CPU it runs the kernels' references (kernels/decode_reference.RefKernels), on "cuda" the real kernels. Shared by
tests/test_gpu_step_reference.py and the GPU tests that repeat its checks on the device."""
from engine.config import ModelConfig

TINY = dict(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2)


def tiny_step_model(tmp_path, device: str = "cpu", scheme: str = "w4", seed: int = 5, slots: int = 2,
                    ctx: int = 64):
    """(its ModelSpec, a GPUModel of `slots` KV slots of `ctx` rows); the environment's DEEPINFER_* settings apply."""
    from engine.formats.load import load_spec
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.quant.make_random import make_random

    make_random(ModelConfig(**TINY), scheme, tmp_path, seed=seed)
    spec = load_spec(str(tmp_path))
    return spec, GPUModel(load_checkpoint(spec.checkpoint, device), slots, ctx, device)


def check_chain_ahead(m, monkeypatch):
    """The run-ahead's checks (GPUModel.decode_chain's ahead, on unless DEEPINFER_CHAIN_AHEAD=0) on a model of the
    references or the GPU: tests/test_gpu_step_reference.py and tests/test_gpu_chain_keys.py call it."""
    prompt = list(range(40, 52))
    first = int(m.prefill(prompt, 0, 0).argmax())
    toks, p = [first], len(prompt)
    m.decode_chain([first], [p], [0], 4, lambda ids: True)  # its graphs captured (their scratch steps write meta)
    for i in range(12):
        toks.append(m.decode([toks[-1]], [p + i], [0])[0][0])
    metas = []
    real = m.write_meta
    monkeypatch.setattr(m, "write_meta", lambda *a, **k: metas.append(a[1]) or real(*a, **k))
    got = []
    assert m.decode_chain([first], [p], [0], 4, lambda ids: got.append(ids[0]) or True, ahead=True) == 4
    assert got == toks[1:5] and metas == [[p]] and m._ahead == ((0,), (p + 4,), (toks[4],), False)
    assert m.decode_chain([toks[4]], [p + 4], [0], 4, lambda ids: got.append(ids[0]) or True, ahead=True) == 4
    assert got == toks[1:9] and metas == [[p]]  # resumed: no plain step
    m.decode([toks[8]], [p + 8], [0])  # a step in between: the chain step queued ahead is not resumed
    assert m._ahead is None and metas == [[p], [p + 8]]
    assert m.decode_chain([toks[9]], [p + 9], [0], 3, lambda ids: got.append(ids[0]) or True) == 3
    assert got == toks[1:9] + toks[10:13] and metas[-1] == [p + 9] and m._ahead is None  # not told: none ahead


def tiny_runner(tmp_path, device: str = "cpu", ctx: int = 64, slots: int = 2):
    """(ModelSpec, GPURunner over tiny_step_model's model: `slots` slots of ctx rows); the runner's own methods, set
    up without its __init__ (which loads a model by name and needs CUDA)."""
    from engine.config import EngineConfig
    from engine.runtime.gpu_runner import GPURunner

    spec, m = tiny_step_model(tmp_path, device, slots=slots, ctx=ctx)
    r = object.__new__(GPURunner)
    r.model, r.max_context, r.free_slots, r.eos_ids = m, ctx, list(range(slots)), set()
    r.chain_stats = GPURunner.new_chain_stats(m)  # as GPURunner.__init__ sets it
    r.cfg = EngineConfig(model=str(tmp_path), device=device, max_context=ctx, max_batch=slots)
    return spec, r


def sampled_outputs(tmp_path, monkeypatch, chain: bool, top_k: int, top_p: float, device: str = "cpu"):
    """A lone request sampling 23 tokens (temperature 1.3, seed 7) through the runner with DEEPINFER_SAMPLE_CHAIN on
    (chains of 5: the draws on the device, chain_sampler.py) or off (one host round trip per token) ->
    (output ids, the generator's next uniform, the runner's chain_stats)."""
    import torch

    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence

    monkeypatch.setenv("DEEPINFER_SAMPLE_CHAIN", "1" if chain else "0")
    spec, r = tiny_runner(tmp_path, device, ctx=64)
    r.cfg.decode_chain = 5  # 23 tokens: the first from the prefill, then chains of 5, 5, 5, 5 and 2
    s = Sequence(list(range(40, 52)), SamplingParams(max_tokens=23, temperature=1.3, top_k=top_k, top_p=top_p,
                                                     seed=7, ignore_eos=True), spec.tokenizer)
    r.allocate(s)
    r.prefill(s)
    while not s.finished:
        r.decode([s])
    if chain and device == "cuda":  # the draw replayed as a captured graph (a failed capture leaves it eager)
        assert r.model.sampler.graph is not None
    assert r.chain_stats["sampled"] == {"chained": r.chain_stats["tokens"] if chain else 0, "batched": 0}
    return s.output_ids, float(torch.rand(1, generator=s.gen, dtype=torch.float64)), \
        {"chains": r.chain_stats["chains"], "tokens": r.chain_stats["tokens"]}


def batch_sampled_outputs(tmp_path, monkeypatch, on: bool, device: str = "cpu"):
    """Two sampling requests (different settings and seeds) and a greedy one decoding together through the runner,
    with the sampling rows drawn on the device behind each batched step (DEEPINFER_SAMPLE_CHAIN on:
    ChainSampler.draw_rows) or by sample() after it (off) -> (output ids per request, each generator's next
    uniform)."""
    import torch

    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence

    monkeypatch.setenv("DEEPINFER_SAMPLE_CHAIN", "1" if on else "0")
    spec, r = tiny_runner(tmp_path, device, ctx=64, slots=3)
    ps = [SamplingParams(max_tokens=12, temperature=1.1, top_p=0.8, seed=5, ignore_eos=True),
          SamplingParams(max_tokens=9, temperature=0.6, top_k=30, seed=9, ignore_eos=True),
          SamplingParams(max_tokens=10, ignore_eos=True)]
    seqs = [Sequence(list(range(40 + 50 * i, 52 + 50 * i)), p, spec.tokenizer) for i, p in enumerate(ps)]
    for s in seqs:
        r.allocate(s)
        r.prefill(s)
    calls = []
    real = r.model.sampler.draw_rows
    monkeypatch.setattr(r.model.sampler, "draw_rows", lambda rows, B: calls.append(len(rows)) or real(rows, B))
    while any(not s.finished for s in seqs):
        r.decode([s for s in seqs if not s.finished])
    # on: every batched step drew its sampling rows behind it: 2 rows for the 8 steps both run, then 1 beside the
    # greedy request; the first request's last 2 tokens, alone, come from a sampled chain
    assert calls == ([2] * 8 + [1] if on else [])
    assert r.chain_stats["sampled"] == ({"chained": 2, "batched": 17} if on else {"chained": 0, "batched": 0})
    return [s.output_ids for s in seqs], [float(torch.rand(1, generator=s.gen, dtype=torch.float64))
                                          for s in seqs[:2]]
