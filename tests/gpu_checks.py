"""Whole-model GPU checks for tests/test_gpu_decode.py: GPU runner vs CPU runner on one random checkpoint, and the
LLM facade on the GPU (helpers, not a test module: pytest collects test_*.py only)."""
from __future__ import annotations

import time

import torch

from engine.config import QWEN25_SHAPES, EngineConfig, ModelConfig
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import Sequence

GAP_TOL = 0.05  # a greedy step may differ only where the CPU's top-2 logits are closer than this


def random_checkpoint(shape: str, scheme: str, layers: int, path: str) -> str:
    from engine.quant.make_random import make_random
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    cfg.num_layers = layers
    make_random(cfg, scheme, path, seed=1, name=f"check-{shape}")
    return path


def gpu_greedy(runner, prompt, n, tok):
    """Greedy tokens and each step's logits (the prefill's, then every decode step's): one token per runner.decode
    (no chain, GPUModel.decode_chain: its steps' logits are not kept)."""
    seq = Sequence(list(prompt), SamplingParams(max_tokens=n, ignore_eos=True), tok)
    runner.allocate(seq)
    chain, runner.cfg.decode_chain = runner.cfg.decode_chain, 0
    try:
        lg = [runner.model.prefill(seq.prompt_ids, seq.slot, 0).cpu()]
        seq.append(int(lg[0].argmax()), runner.eos_ids)
        while not seq.finished:
            runner.decode([seq])
            lg.append(runner.model.logits[0].cpu().clone())
    finally:
        runner.cfg.decode_chain = chain
        runner.release(seq)
    return seq.output_ids, torch.stack(lg[:len(seq.output_ids)])


def chain_check(runner, prompts, n, tok, alone) -> dict:
    """GPUModel.decode_chain (steps queued on the GPU, tokens read there from the argmax keys) against the tokens of
    one-token steps: each prompt alone through the runner (a lone greedy request chains), and all of them in one
    chain of B = len(prompts) sequences."""
    m = runner.model
    lone = Scheduler(runner).run([Sequence(list(p), SamplingParams(max_tokens=n, ignore_eos=True), tok)
                                  for p in prompts[:1]])[0].output_ids
    seqs = [Sequence(list(p), SamplingParams(max_tokens=n, ignore_eos=True), tok) for p in prompts]
    for s in seqs:
        runner.allocate(s)
    try:
        firsts = [int(m.prefill(s.prompt_ids, s.slot, 0).argmax()) for s in seqs]
        got = [[f] for f in firsts]
        m.decode_chain(firsts, [len(s.prompt_ids) for s in seqs], [s.slot for s in seqs], n - 1,
                       lambda ids: [g.append(i) for g, i in zip(got, ids)] and True)
    finally:
        for s in seqs:
            runner.release(s)
    return {"lone_equal": lone == alone[0], "batch_equal": got == alone,
            "chain_graphs": sorted(m.chain_graphs), "chained_tokens": runner.chain_stats["tokens"]}


def compare_runners(shape: str, scheme: str, log) -> dict:
    from engine.runtime.gpu_runner import GPURunner
    from engine.runtime.cpu_runner import CPURunner
    from engine.formats.load import load_spec

    d = random_checkpoint(shape, scheme, 2, f"/tmp/deepinfer_check_{shape}_{scheme}")
    spec = load_spec(d)
    cpu = CPURunner(spec, EngineConfig(model=d, device="cpu", max_context=256, max_batch=1))
    gpu = GPURunner(spec, EngineConfig(model=d, device="cuda", max_context=256, max_batch=4))
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, spec.config.vocab_size, (20,), generator=g).tolist()
    toks, glog = gpu_greedy(gpu, prompt, 64, spec.tokenizer)
    clog = cpu.logits(prompt + toks[:-1])[len(prompt) - 1:]  # teacher-forced on the GPU's tokens
    errs = [float((a - b).norm() / b.norm()) for a, b in zip(glog, clog)]
    agree, bad = 0, []
    for i, t in enumerate(toks):
        c = int(clog[i].argmax())
        if c == t:
            agree += 1
        elif float(clog[i][c] - clog[i][t]) > GAP_TOL:
            bad.append({"step": i, "gpu": t, "cpu": c, "gap": float(clog[i][c] - clog[i][t])})
    # batch invariance: 3 sequences decoded together == each alone
    prompts = [prompt[:7], prompt, prompt[3:15]]
    alone = [gpu_greedy(gpu, p, 12, spec.tokenizer)[0] for p in prompts]
    seqs = Scheduler(gpu).run([Sequence(list(p), SamplingParams(max_tokens=12, ignore_eos=True), spec.tokenizer)
                               for p in prompts])  # the engine thread's batching
    batch_ok = [s.output_ids for s in seqs] == alone
    chain = chain_check(gpu, prompts, 12, spec.tokenizer, alone)
    r = {"shape": shape, "scheme": scheme, "layers": 2, "max_rel_err": max(errs), "mean_rel_err": sum(errs) / len(errs),
         "greedy_agree": agree, "steps": len(toks), "bad_divergences": bad, "batch_equals_single": batch_ok,
         "chain": chain, "ok": max(errs) < 2e-2 and not bad and batch_ok and chain["lone_equal"] and chain["batch_equal"]}
    log(f"  {shape} {scheme}: logits rel err max {max(errs):.2e} mean {r['mean_rel_err']:.2e}; greedy {agree}/64 "
        f"agree, {len(bad)} beyond tolerance; batch == single: {batch_ok}; chain: {chain}")
    del cpu, gpu
    torch.cuda.empty_cache()
    return r


def llm_check(log) -> dict:
    """engine.runtime.llm.LLM on the GPU: streaming, EOS stop, seeded sampling, dense spec quantized at load."""
    from engine.formats.checkpoint import hf_weights
    from engine.runtime.gpu_runner import GPURunner
    from engine.runtime.llm import LLM
    from engine.formats.spec import ModelSpec

    d = random_checkpoint("0.5b", "w4", 2, "/tmp/deepinfer_check_llm")
    llm = LLM(EngineConfig(model=d, device="cuda", max_context=512, max_batch=4))
    r = {"runner": type(llm.runner).__name__, "load_s": llm.load_seconds}
    ev = list(llm.stream("Hello there", SamplingParams(max_tokens=16, ignore_eos=True)))
    r["stream_events"], r["stream_finish"] = len(ev), ev[-1].finish_reason
    c = llm.complete("Count: 1 2 3", SamplingParams(max_tokens=48, ignore_eos=True))
    r["complete_tokens"], r["decode_tps_0.5b_2layers"] = c.completion_tokens, c.decode_tps
    first = c.token_ids[0]
    saved = llm.runner.eos_ids
    stop_tok = c.token_ids[5]  # pretend this token is EOS: generation must stop right before it
    llm.runner.eos_ids = saved | {stop_tok}
    c2 = llm.complete("Count: 1 2 3", SamplingParams(max_tokens=48))
    llm.runner.eos_ids = saved
    r["eos_stop"] = c2.finish_reason == "stop" and c2.token_ids == c.token_ids[:c.token_ids.index(stop_tok)]
    p = SamplingParams(max_tokens=24, temperature=0.8, top_k=50, top_p=0.9, seed=7)
    r["seeded_sampling_repeatable"] = llm.complete("Hi", p).token_ids == llm.complete("Hi", p).token_ids
    spec = llm.spec
    dense = ModelSpec(spec.config, spec.tokenizer, spec.chat_template, "dense", lambda: hf_weights(spec.checkpoint))
    t0 = time.perf_counter()
    dr = GPURunner(dense, EngineConfig(model=d, device="cuda", max_context=128, max_batch=1))
    ids = spec.tokenizer.encode("Count: 1 2 3")
    a, b = dr.logits(ids), llm.runner.logits(ids)
    r["dense_load_s"] = time.perf_counter() - t0
    r["dense_vs_checkpoint_rel_err"] = float((a - b).norm() / b.norm())
    r["first_token"] = first
    r["ok"] = r["stream_finish"] == "length" and r["eos_stop"] and r["seeded_sampling_repeatable"] and \
        r["dense_vs_checkpoint_rel_err"] < 5e-2
    log(f"  LLM: {r}")
    return r


def model_checks(log) -> dict:
    out = {"runners": [compare_runners(s, sc, log) for s, sc in (("3b", "w4"), ("0.5b", "w3"))]}
    out["llm"] = llm_check(log)
    return out
