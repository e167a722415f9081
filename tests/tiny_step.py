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


def tiny_runner(tmp_path, device: str = "cpu", ctx: int = 64):
    """(ModelSpec, GPURunner over tiny_step_model's model: 2 slots of ctx rows); the runner's own methods, set up
    without its __init__ (which loads a model by name and needs CUDA)."""
    from engine.config import EngineConfig
    from engine.runtime.gpu_runner import GPURunner

    spec, m = tiny_step_model(tmp_path, device, ctx=ctx)
    r = object.__new__(GPURunner)
    r.model, r.max_context, r.free_slots, r.eos_ids = m, ctx, [0, 1], set()
    r.chain_stats = {"chains": 0, "tokens": 0, "ahead": m.ahead_stats}  # as GPURunner.__init__ sets it
    r.cfg = EngineConfig(model=str(tmp_path), device=device, max_context=ctx, max_batch=2)
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
        assert list(r.model.sampler.graphs.values()) and all(g is not None for g in r.model.sampler.graphs.values())
    return s.output_ids, float(torch.rand(1, generator=s.gen, dtype=torch.float64)), \
        {"chains": r.chain_stats["chains"], "tokens": r.chain_stats["tokens"]}
