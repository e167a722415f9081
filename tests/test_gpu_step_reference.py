"""The GPU decode step (engine/model/gpu_model.py) run on the CPU with the kernels' PyTorch references
(kernels/decode_reference.RefKernels): same logits and greedy tokens as the CPU runner, batched decode
equal to single decode. Runs everywhere (no CUDA, no CuPy); the device runs the real kernels."""

import pytest
import torch

from engine.config import EngineConfig
from tiny_step import batch_sampled_outputs, check_chain_ahead, sampled_outputs, tiny_runner, tiny_step_model


@pytest.mark.parametrize("merge_from,merge", [("4096", "launch"), ("8", "launch"), ("8", "grid")])
def test_step_on_references_matches_cpu_runner(tmp_path, monkeypatch, merge_from, merge):
    # "8": from the 8th row on the long-context graphs' ops; "grid": their plain steps ask for the grid merge
    monkeypatch.setenv("DEEPINFER_ATTN_MERGE_FROM", merge_from)
    monkeypatch.setenv("DEEPINFER_ATTN_MERGE", merge)
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.runtime.cpu_runner import CPURunner

    spec, m = tiny_step_model(tmp_path, scheme="w3", seed=2)
    cpu = CPURunner(spec, EngineConfig(model=str(tmp_path), device="cpu", max_context=64, max_batch=1))
    assert m._merge(13) == (merge_from == "8") and m.merge_kind == merge
    from engine.model.ops_step import StepOps
    assert StepOps(m, 1, merge=True).plain_merge == ("grid" if merge == "grid" else True)  # what attention() gets
    monkeypatch.setenv("DEEPINFER_ATTN_MERGE", "fast")
    with pytest.raises(ValueError, match="'grid' or 'launch'"):
        GPUModel(load_checkpoint(spec.checkpoint, "cpu"), 2, 64, "cpu")
    prompt = list(range(40, 52))
    lg = m.prefill(prompt, 0, 0)
    toks, logs = [int(lg.argmax())], [lg]
    for i in range(6):
        ids, l = m.decode([toks[-1]], [len(prompt) + i], [0])
        toks.append(ids[0])
        logs.append(l[0].clone())
    ref = cpu.logits(prompt + toks[:-1])[len(prompt) - 1:]
    for a, b in zip(logs, ref):
        assert float((a - b).norm() / b.norm()) < 1e-2
    assert toks == [int(r.argmax()) for r in ref]
    m.prefill(prompt[:5], 1, 0)
    ids, _ = m.decode([toks[0], 7], [len(prompt), 5], [0, 1])
    assert ids[0] == toks[1]


@pytest.mark.parametrize("keys", ["kernel", "copy"])
def test_chain_steps_equal_plain_steps_and_stop_where_told(tmp_path, monkeypatch, keys):
    """GPUModel.decode_chain on the references: the chain step takes its tokens from the last step's argmax keys and
    moves the positions on by itself (embed_rows' chain mode, chain_advance_ref); the ids equal the host-driven
    decode() loop's for 2 sequences at once, a stop after 3 steps returns 3 (the step queued past it writes K/V one
    row beyond the end) and plain steps from there go on with the same tokens. keys: how a chain step's argmax keys
    reach the host (its own keys_host kernel into the row of its cache row's parity, or a copy behind it)."""
    monkeypatch.setenv("DEEPINFER_CHAIN_KEYS", "dma")
    with pytest.raises(ValueError, match="'kernel' or 'copy'"):
        tiny_step_model(tmp_path / "bad")
    if keys == "kernel":  # the default (measured: chain_gap_kernel_h100.json)
        monkeypatch.delenv("DEEPINFER_CHAIN_KEYS")
        assert tiny_step_model(tmp_path / "default")[1].chain_keys == "kernel"
    monkeypatch.setenv("DEEPINFER_CHAIN_KEYS", keys)
    _, m = tiny_step_model(tmp_path / "ok")
    assert m.chain_keys == keys
    prompts = [list(range(40, 52)), list(range(300, 307))]
    firsts = [int(m.prefill(p, s, 0).argmax()) for s, p in enumerate(prompts)]
    toks, pos = [firsts], [len(p) for p in prompts]
    for i in range(8):
        ids, _ = m.decode(toks[-1], [p + i for p in pos], [0, 1])
        toks.append(ids)
    got = []
    assert m.decode_chain(firsts, pos, [0, 1], 8, lambda ids: got.append(ids) or True) == 8
    assert got == toks[1:]
    assert m.meta[1, :2].tolist() == [p + 7 for p in pos] and m.meta[0, :2].tolist() == toks[7]
    got = []
    assert m.decode_chain(firsts, pos, [0, 1], 8, lambda ids: got.append(ids) or len(got) < 3) == 3
    assert got == toks[1:4]
    rest = [m.decode(toks[i], [p + i for p in pos], [0, 1])[0] for i in range(3, 8)]
    assert rest == toks[4:9]


@pytest.mark.parametrize("keys", ["kernel", "copy"])
def test_chain_resumes_from_the_step_it_ran_ahead(tmp_path, monkeypatch, keys):
    """decode_chain(..., ahead=True) on the references (on by default; DEEPINFER_CHAIN_AHEAD=0 off): the next call's
    first step is queued before the last ids are read, the next call with those ids, positions and slots starts from
    it (no plain step: no write_meta) with the host loop's tokens, and a step in between drops it (the call after
    runs its plain step, same tokens): tests/tiny_step.py check_chain_ahead."""
    monkeypatch.setenv("DEEPINFER_CHAIN_KEYS", keys)
    monkeypatch.setenv("DEEPINFER_CHAIN_AHEAD", "0")
    _, m = tiny_step_model(tmp_path / "off")
    assert not m.chain_ahead
    assert m.decode_chain([5], [3], [0], 3, lambda ids: True, ahead=True) == 3 and m._ahead is None
    monkeypatch.delenv("DEEPINFER_CHAIN_AHEAD")
    _, m = tiny_step_model(tmp_path / "on")
    assert m.chain_ahead
    check_chain_ahead(m, monkeypatch)


def test_runner_chains_a_lone_greedy_request_with_the_same_output(tmp_path):
    """GPURunner.decode over the reference step: a lone greedy request takes up to cfg.decode_chain tokens per engine
    step, with the same output as one token per step; EOS and max_tokens stop it mid-chain; a sampling request chains
    too (with DEEPINFER_SAMPLE_CHAIN=0 one token per step), and batches keep one token per step."""
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence

    spec, r = tiny_runner(tmp_path)
    m = r.model

    def run(chain: int, max_tokens: int = 21, **kw) -> tuple[list[int], int]:
        r.cfg.decode_chain = chain
        s = Sequence(list(range(40, 52)), SamplingParams(max_tokens=max_tokens, **kw), spec.tokenizer)
        r.allocate(s)
        r.prefill(s)
        steps = 0
        while not s.finished:
            r.decode([s])
            steps += 1
        r.release(s)
        return s.output_ids, steps

    plain, steps = run(0, ignore_eos=True)
    assert len(plain) == 21 and steps == 20
    chained, steps = run(8, ignore_eos=True)
    assert chained == plain and steps == 3  # 8 + 8 + 4 tokens after the prefill's
    # the first two chains had tokens left after them: each queued the next one's first step, which it resumed from
    assert r.chain_stats == {"chains": 3, "tokens": 20, "ahead": {"queued": 2, "resumed": 2},
                             "sampled": {"chained": 0, "batched": 0}}
    r.eos_ids = {plain[11]}  # EOS inside the second chain: output ends right before it
    cut = plain.index(plain[11])
    assert run(8)[0] == plain[:cut] and run(0)[0] == plain[:cut]
    r.eos_ids = set()
    assert run(8, max_tokens=5, ignore_eos=True) == (plain[:5], 1)
    sampled = run(8, temperature=0.8, seed=3, ignore_eos=True)
    assert sampled[1] == 3  # drawn inside the chains (chain_sampler.py)
    m.sample_chain = False
    assert run(8, temperature=0.8, seed=3, ignore_eos=True) == (sampled[0], 20)  # one token per engine step
    m.sample_chain = True
    # a speculating request (prompt lookup, no draft heads) chains only its back-off's plain steps, same output
    from engine.runtime import speculative
    from engine.runtime.gpu_runner import GPURunner
    r.cfg.decode_chain, r.cfg.speculative_gpu, r.chain_stats = 16, True, GPURunner.new_chain_stats(m)
    s = Sequence(list(range(40, 52)), SamplingParams(max_tokens=21, ignore_eos=True, speculative=True), spec.tokenizer)
    r.allocate(s)
    r.prefill(s)
    s.spec_skip = 5  # as after a missed draft: this step and 5 more decode the plain way
    before = dict(m.ahead_stats)
    speculative.decode(r, [s])  # takes one back-off step itself (5 -> 4 left), then chains 1 + 4
    assert len(s.output_ids) == 6 and s.spec_skip == 0 and r.chain_stats["chains"] == 1
    assert r.chain_stats["tokens"] == 5 and m.ahead_stats == before  # drafts decide its next step: none run ahead
    while not s.finished:
        speculative.decode(r, [s])
    r.release(s)
    assert s.output_ids == plain


def test_merge_launch_default_follows_the_split_count(tmp_path, monkeypatch):
    """The long-context graphs (attention merge as its own launch) are on by default only where a token has >= 32
    splits (the H200's 66 / 33, where they were measured); the references' 8 'SMs' give 4: off unless asked for."""
    monkeypatch.delenv("DEEPINFER_ATTN_MERGE_FROM", raising=False)
    _, m = tiny_step_model(tmp_path)
    assert m.ws.splits(1) < 32 and m.merge_from == 0 and not m._merge(10 ** 6)
    monkeypatch.setenv("DEEPINFER_ATTN_MERGE_FROM", "4096")
    _, m = tiny_step_model(tmp_path / "b")
    assert m.merge_from == 4096 and m._merge(4096) and not m._merge(4095)


def test_chain_keys_mode_falls_back_to_the_copy_without_unified_addressing(caplog):
    """The chain step's keys_host kernel writes pinned memory by its host pointer, which needs unified addressing
    (every 64-bit CUDA platform): where the device lacks it (or the query fails: DecodeKernels.unified_addressing)
    the keys are copied instead, logged; DEEPINFER_CHAIN_KEYS picks otherwise, a bad value is an error."""
    from engine.model.gpu_model import chain_keys_mode
    assert chain_keys_mode(None, True) == "kernel" and chain_keys_mode("", True) == "kernel"
    assert chain_keys_mode("copy", True) == "copy" and chain_keys_mode("copy", False) == "copy"
    with caplog.at_level("WARNING", logger="deepinfer.gpu"):
        assert chain_keys_mode(None, False) == "copy" and chain_keys_mode("kernel", False) == "copy"
    assert "no unified addressing" in caplog.text
    with pytest.raises(ValueError, match="'kernel' or 'copy'"):
        chain_keys_mode("dma", True)


def test_reference_gemv_memo_follows_in_place_changes():
    """decode_reference.dense_weight_memo (the reference step's unpacked weights, kept between calls): the same
    product as unpacking each call, and a weight changed in place (its version counter moves) is unpacked again."""
    import torch

    from kernels import decode_reference as ref
    from kernels.checks import rand_qweight

    gen = torch.Generator().manual_seed(3)
    w = rand_qweight(64, 256, 4, "cpu", gen)
    x = torch.randn(2, 256, generator=gen).half()
    first = ref.gemv_ref(x, w, bias=False)
    assert torch.equal(ref.gemv_ref(x, w, bias=False), first)  # from the memo
    assert torch.equal(first, torch.cat([r.float() @ ref.dense_weight(w).T for r in x.split(1)]))
    w.qweight[0].bitwise_xor_(0x11111111)  # one row's codes change in place
    changed = ref.gemv_ref(x, w, bias=False)
    assert not torch.equal(changed[:, 0], first[:, 0]) and torch.equal(changed[:, 1:], first[:, 1:])


def test_runner_batch_ahead_gives_the_same_tokens(tmp_path, monkeypatch):
    """DEEPINFER_BATCH_AHEAD (the default) on the references: two greedy requests decoding together take one-step chains
    whose next step runs ahead (GPURunner._decode_batch_ahead); their outputs equal the host-driven batch's, the
    steps after the first resume from the step run ahead, and a request finishing ends it (the other goes on alone)."""
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence

    def outputs(batch_ahead: bool) -> tuple[list[list[int]], dict]:
        monkeypatch.setenv("DEEPINFER_BATCH_AHEAD", "1" if batch_ahead else "0")
        spec, r = tiny_runner(tmp_path / str(batch_ahead))
        m = r.model
        assert m.batch_ahead == batch_ahead
        seqs = [Sequence(p, SamplingParams(max_tokens=k, ignore_eos=True), spec.tokenizer)
                for p, k in ((list(range(40, 52)), 9), (list(range(300, 307)), 14))]
        for s in seqs:
            r.allocate(s)
            r.prefill(s)
        while any(not s.finished for s in seqs):
            r.decode([s for s in seqs if not s.finished])
        return [s.output_ids for s in seqs], dict(m.ahead_stats)

    plain, stats = outputs(False)
    assert stats == {"queued": 0, "resumed": 0} and [len(o) for o in plain] == [9, 14]  # (the lone chain: none)
    ahead, stats = outputs(True)
    assert ahead == plain
    # the pair's steps 2..8 resumed from the step before's (the 8th queued none: the first request's last token);
    # then the second request alone chains its last 5 tokens at once (nothing left after them: none ahead)
    assert stats == {"queued": 7, "resumed": 7}



@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (20, 1.0)])
def test_runner_chains_a_sampling_request_with_the_host_paths_tokens(tmp_path, monkeypatch, top_k, top_p):
    """A lone request with temperature > 0 chains its steps, each token drawn after its step by the same ops as
    sampling.sample (chain_sampler.py) with the generator's uniforms in order: the seed gives the tokens of one host
    round trip per token (DEEPINFER_SAMPLE_CHAIN=0), and the generator ends where the host path leaves it."""
    def run(chain: bool):
        return sampled_outputs(tmp_path / str(chain), monkeypatch, chain, top_k, top_p)

    plain, u_plain, stats = run(False)
    assert stats == {"chains": 0, "tokens": 0} and len(plain) == 23
    chained, u_chained, stats = run(True)
    assert chained == plain and u_chained == u_plain
    assert stats == {"chains": 5, "tokens": 22}
    assert len(set(plain)) > 5  # the draws did something (temperature 1.3 over random weights)


def test_sampled_chain_stopping_early_rewinds_the_generator(tmp_path):
    """decode_chain(sample=...) stopped by on_ids after 3 of 6 steps leaves the generator after 3 draws; the tokens
    are decode() + sample()'s."""
    from engine.runtime.sampling import SamplingParams, make_generator, sample

    _, m = tiny_step_model(tmp_path)
    p = SamplingParams(max_tokens=8, temperature=0.9, seed=3)
    prompt = list(range(40, 52))
    m.prefill(prompt, 0, 0)
    g = make_generator(3)
    toks, pos = [5], len(prompt)
    for i in range(3):
        _, logits = m.decode([toks[-1]], [pos + i], [0])
        toks.append(sample(logits[0], p, g))
    after = float(torch.rand(1, generator=g, dtype=torch.float64))
    g2, got = make_generator(3), [5]
    m.decode_chain([5], [pos], [0], 6, lambda ids: got.append(ids[0]) or len(got) < 4, sample=(p, g2))
    assert got == toks and float(torch.rand(1, generator=g2, dtype=torch.float64)) == after


def test_batched_sampling_rows_drawn_behind_the_step_give_sample_s_tokens(tmp_path, monkeypatch):
    """Sampling rows of a batched step drawn behind it (ChainSampler.draw_rows, their ids in the step's keys) give
    the tokens of sample() after the step, and leave each generator where sample() does; a greedy row beside them
    keeps its argmax."""
    off = batch_sampled_outputs(tmp_path / "off", monkeypatch, False)
    on = batch_sampled_outputs(tmp_path / "on", monkeypatch, True)
    assert on == off and [len(o) for o in on[0]] == [12, 9, 10]


def test_a_sampling_kernel_that_fails_at_warmup_leaves_the_host_path(tmp_path, monkeypatch, caplog):
    """If the sampling kernel cannot run (its module does not build, a launch fails), warmup says so once and turns
    sampling on the GPU off: a sampling request then decodes through the host path, with the same tokens."""
    want, _, _ = sampled_outputs(tmp_path / "plain", monkeypatch, False, 0, 0.9)
    monkeypatch.setenv("DEEPINFER_SAMPLE_CHAIN", "1")
    spec, r = tiny_runner(tmp_path / "broken")
    m = r.model
    assert m.sample_chain

    def broken(*a, **k):
        raise RuntimeError("nvrtc: error: no module")
    monkeypatch.setattr(m.kn, "sample_rows", broken, raising=False)
    with caplog.at_level("WARNING", logger="deepinfer.gpu"):
        m.warmup(2)
    assert not m.sample_chain and "sampling on the GPU off" in caplog.text
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence
    r.cfg.decode_chain = 5
    s = Sequence(list(range(40, 52)), SamplingParams(max_tokens=23, temperature=1.3, top_p=0.9, seed=7,
                                                     ignore_eos=True), spec.tokenizer)
    r.allocate(s)
    r.prefill(s)
    while not s.finished:
        r.decode([s])
    assert s.output_ids == want


def test_the_draws_self_check_refuses_a_kernel_that_draws_other_tokens(tmp_path, monkeypatch):
    """Warmup checks the sampling kernels against their reference on the card (ChainSampler.check: peaked, flat and
    half-masked rows, three settings) before it captures the draw: the reference passes; a kernel that draws another
    token raises, which warmup turns into the host path (the test above)."""
    monkeypatch.setenv("DEEPINFER_SAMPLE_CHAIN", "1")
    _, r = tiny_runner(tmp_path / "check")
    m = r.model
    m.sampler.check()  # the references: the same tokens

    def off_by_one(logits, prm, u, at, keys, B):
        from kernels.sample_reference import sample_rows_ref
        sample_rows_ref(logits, prm, u, at, keys, B)
        keys[:B] -= 1
    monkeypatch.setattr(m.kn, "sample_rows", off_by_one, raising=False)
    with pytest.raises(RuntimeError, match="the sampling kernels drew"):
        m.sampler.check()
