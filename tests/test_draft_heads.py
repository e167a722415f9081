"""Draft heads (engine/draft/heads.py, engine/runtime/draft_heads.py, engine/draft/train.py): the file checks,
the drafter on the GPU step's code path (GPUModel on the kernels' references), greedy output unchanged with the
heads bundled for the real 0.5B, and the trainer end to end on tiny settings. GPU: tests/test_gpu_draft_heads.py."""
from __future__ import annotations

import json

import pytest
import numpy as np
import torch

from engine.config import EngineConfig, ModelConfig
from engine.draft import heads as H
from engine.formats.load import load_spec
from engine.model.gpu_load import load_checkpoint
from engine.model.gpu_model import GPUModel
from engine.quant.make_random import make_random
from engine.runtime.sampling import SamplingParams
from kernels.decode_reference import dense_weight

MODEL = "qwen2.5-coder-0.5b"
SOURCE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_heads_file_round_trip_and_bad_files(tmp_path):
    w, b = torch.randn(3, 16, 32) * 0.1, torch.randn(3, 16) * 0.1
    H.save(tmp_path / "a.heads.safetensors", w, b, {"model": "m", "vocab_size": 50})
    w2, b2, meta = H.load(tmp_path / "a.heads.safetensors", 16)
    assert torch.equal(w2, w.half()) and torch.equal(b2, b.half()) and meta["vocab_size"] == 50
    x, e = torch.randn(16), torch.randn(16)
    z = H.residual(x, e, w, b)
    assert torch.allclose(z[1], x + torch.nn.functional.silu(w[1] @ torch.cat([x, e]) + b[1]), atol=1e-5)
    with pytest.raises(H.HeadsError, match="hidden size 16"):
        H.load(tmp_path / "a.heads.safetensors", 32)
    with pytest.raises(H.HeadsError, match="not found"):
        H.load(tmp_path / "missing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(H.HeadsError, match="unreadable"):
        H.load(tmp_path / "bad.safetensors")
    from safetensors.torch import save_file
    save_file({"w": w, "b": b}, str(tmp_path / "other.safetensors"), metadata={"schema": "x"})
    with pytest.raises(H.HeadsError, match="not a draft heads file"):
        H.load(tmp_path / "other.safetensors")


def test_bundled_heads_exist_for_the_default_model():
    p = H.bundled(SOURCE)
    assert p is not None, "assets/drafters/ lacks the 0.5B's heads"
    w, b, meta = H.load(p, 896)
    assert meta["source"] == SOURCE and meta["vocab_size"] == 151936 and w.shape[0] == meta["heads"]


def gpu_runner(tmp_path, heads_w, heads_b, device="cpu"):
    """A GPURunner over a random 2-layer GPUModel on `device` ("cpu": the kernels' references) with draft heads."""
    from engine.runtime.draft_heads import DraftHeads
    from engine.runtime.gpu_runner import GPURunner
    cfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    make_random(cfg, "w4", tmp_path, seed=3, name="heads-check")
    m = GPUModel(load_checkpoint(load_spec(str(tmp_path)).checkpoint, device), 2, 96, device)
    r = object.__new__(GPURunner)  # the runner's own methods over the CPU model (its __init__ needs CUDA)
    r.model, r.max_context, r.free_slots, r.eos_ids = m, 96, [0, 1], set()
    r.chain_stats = GPURunner.new_chain_stats(m)
    r.cfg = EngineConfig(model=str(tmp_path), device="cpu", max_context=96, max_batch=2, speculative_gpu=True)
    r.heads = DraftHeads(r, heads_w, heads_b, {})
    return r


def test_heads_draft_on_the_gpu_step_path_and_keep_greedy_output(tmp_path):
    check_heads_on_step_path(tmp_path, "cpu")


def check_heads_on_step_path(tmp_path, device: str):
    """GPURunner + GPUModel (on the references for "cpu"): the heads read the step's x rows, draft through the decode
    GEMV's fused argmax (== the plain formula), and speculation with them gives the plain greedy tokens."""
    from engine.runtime import speculative
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence
    g = torch.Generator().manual_seed(0)
    r = gpu_runner(tmp_path, torch.randn(4, 256, 512, generator=g) * 0.05, torch.randn(4, 256, generator=g) * 0.05,
                   device)
    tok = load_spec(str(tmp_path)).tokenizer
    prompt = torch.randint(0, 1024, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    plain = Sequence(prompt, SamplingParams(max_tokens=20, ignore_eos=True), tok)
    r.allocate(plain)
    r.prefill(plain)
    while not plain.finished:
        r.decode([plain])
    r.release(plain)
    s = Sequence(prompt, SamplingParams(max_tokens=20, ignore_eos=True, speculative=True), tok)
    r.allocate(s)
    r.prefill(s)
    assert s.hidden is None and r.heads.propose(s, 4) == []  # nothing to draft from before the first step
    speculative.decode(r, [s])  # a plain step records the hidden row
    assert s.hidden is not None and s.hidden.shape == (256,)
    got = r.heads.propose(s, 4)
    e = dense_weight(r.model.w.embed, torch.tensor([s.output_ids[-1]])).float().cpu()[0]
    z = H.residual(s.hidden.float().cpu(), e, r.heads.w.float().cpu(), r.heads.b.float().cpu())
    logits = z.half().float() @ dense_weight(r.model.w.lm_head).float().cpu().T
    picked = logits.gather(1, torch.tensor(got)[:, None])[:, 0]
    assert torch.allclose(picked, logits.max(-1).values, atol=2e-2), (got, logits.argmax(-1).tolist())
    toks, parents = r.heads.propose_tree(s, 4, 7)  # the tree: head 1's 3 best, head 2's 2 best under its best, ..
    from engine.runtime.draft_heads import TREE
    assert parents == [-1, 0, 0, 0, 1, 1, 4] and len(toks) == len(TREE)
    top = logits.topk(4, dim=-1)
    for node, path in enumerate(TREE, 1):
        v = logits[len(path) - 1, toks[node - 1]]
        assert abs(float(v) - float(top.values[len(path) - 1, path[-1]])) < 2e-2, (node, path)
    fused = r.heads.tree_step(s, s.num_tokens - 1)  # draft + verify in one round trip: the same tree, its verify
    assert fused[0] == toks and fused[1] == parents
    ids, _ = r.model.verify([s.output_ids[-1]] + toks, s.num_tokens - 1, s.slot, parents=parents)
    assert fused[2][0] == ids
    assert r.heads.propose_tree(s, 1, 7)[1] == [-1, 0, 0, 0]  # one token left: depth 1 only
    assert r.heads.propose_tree(s, 4, 2)[1] == [-1, 0, 0]  # two rows left in the context
    # the draft vocabulary (here every other id): the tree's tokens are the top-k over those rows, mapped to ids
    from engine.runtime.draft_heads import DraftHeads
    sub = DraftHeads(r, r.heads.w, r.heads.b, {}, vocab=np.arange(0, r.model.w.lm_head.N, 2))
    toks2, _ = sub.propose_tree(s, 4, 7)
    top2 = logits[:, ::2].topk(4, dim=-1)
    for node, path in enumerate(TREE, 1):
        v = logits[len(path) - 1, toks2[node - 1]]
        assert toks2[node - 1] % 2 == 0 and abs(float(v) - float(top2.values[len(path) - 1, path[-1]])) < 2e-2
    assert sub.propose(s, 2) == toks2[:1] + [toks2[3]]  # each head's best: head 1's first node, head 2's under it
    while not s.finished:  # greedy, alone: the heads' drafts go as trees, in bursts
        speculative.decode(r, [s])
    assert s.output_ids == plain.output_ids
    st = speculative.report(r)["by_source"]["burst"]
    assert st["verify_steps"] > 0 and st["drafted"] >= st["verify_steps"]
    r.release(s)
    r.cfg.draft_tree = False  # the chain (what sampled requests get)
    c = Sequence(prompt, SamplingParams(max_tokens=20, ignore_eos=True, speculative=True), tok)
    r.allocate(c)
    r.prefill(c)
    while not c.finished:
        speculative.decode(r, [c])
    assert c.output_ids == plain.output_ids
    st = speculative.report(r)["by_source"]["heads"]
    assert st["verify_steps"] > 0 and st["drafted"] >= st["verify_steps"]


def test_real_0_5b_bundled_heads_keep_greedy_output_and_accept(spec):
    """The heads shipped for the real 0.5B (trained on the device: docs/results/draft_heads_train_0.5b.json), on the
    CPU ("on"): translate and rewrite outputs equal plain greedy decoding, and head drafts are accepted."""
    from engine.bench.hotpath import TEXTS
    from engine.runtime import speculative
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams
    from trayapp.config import default_config
    from trayapp.templates import render_messages
    llm = LLM(EngineConfig(model=MODEL, device="cpu", max_context=512, max_batch=1, draft_heads="on",
                           prefix_cache_mb=0), spec=spec)  # the session's loaded model (conftest)
    assert llm.runner.heads is not None
    cfg = default_config("zh")
    for tid, text in (("translate", TEXTS[0]), ("rewrite", TEXTS[1])):
        prompt = llm.render(render_messages(cfg.template(tid), text, cfg.lang))
        a = llm.complete(prompt, SamplingParams(max_tokens=24, temperature=0.0))
        b = llm.complete(prompt, SamplingParams(max_tokens=24, temperature=0.0, speculative=True))
        assert a.token_ids == b.token_ids, (tid, a.text, b.text)
    st = speculative.report(llm.runner)["by_source"]["heads"]
    assert st["accepted"] > 0, st


def test_auto_heads_on_the_cpu_draft_over_the_draft_vocabulary_and_a_bad_file_is_a_clear_error(tmp_path, spec):
    """"auto" loads the bundled heads on the CPU too (docs/hotpath.md "Drafts on the CPU"): one draft a step, the
    model's own head over the draft vocabulary (float32 rows here), each draft the argmax of the full head's logits
    over those rows; "off" loads none."""
    from engine.draft import vocab as draft_vocab
    from engine.runtime.draft_heads import DraftHeads
    from engine.runtime.llm import LLM
    from engine.runtime.sequence import Sequence
    llm = LLM(EngineConfig(model=MODEL, device="cpu", max_context=256, max_batch=1, prefix_cache_mb=0), spec=spec)
    h = llm.runner.heads
    assert h is not None and h.K == 1 and h.w.shape[0] == 1 and len(h.sub) == 32768
    assert torch.equal(h.sub, torch.as_tensor(draft_vocab.load(151936)))
    s = Sequence([1, 2, 3], SamplingParams(max_tokens=8), llm.tokenizer)
    s.output_ids.append(1000)
    s.hidden = torch.randn(896, generator=torch.Generator().manual_seed(0))
    (got,) = h.propose(s, 4)  # at most K (spec_heads_cpu) drafts
    z = H.residual(s.hidden, h.embed[1000].float(), h.w, h.b)
    full = z @ llm.runner.model.head_weight().float().T
    assert int(got) in h.sub.tolist() and abs(float(full[0, got]) - float(full[0, h.sub].max())) < 1e-3
    assert DraftHeads.load(llm.runner, llm.spec, "off") is None
    (tmp_path / "x.heads.safetensors").write_bytes(b"garbage")
    with pytest.raises(H.HeadsError, match="unreadable"):
        DraftHeads.load(llm.runner, llm.spec, str(tmp_path / "x.heads.safetensors"))
    H.save(tmp_path / "v.heads.safetensors", torch.zeros(2, 896, 1792), torch.zeros(2, 896), {"vocab_size": 1000})
    with pytest.raises(H.HeadsError, match="vocabulary"):
        DraftHeads.load(llm.runner, llm.spec, str(tmp_path / "v.heads.safetensors"))


def test_int8_cpu_heads_draft_with_the_int8_head_and_keep_greedy_output(spec):
    """The tray's CPU weights (int8): the heads draft through int8 rows of the model's own head (the verify step's
    codes) and speculative translation gives plain greedy decoding's tokens, with drafts accepted."""
    from engine.bench.hotpath import TEXTS
    from engine.runtime import speculative
    from engine.runtime.llm import LLM
    from kernels.cpu_int8 import Int8Linear
    from trayapp.config import default_config
    from trayapp.templates import render_messages
    llm = LLM(EngineConfig(model=MODEL, device="cpu", max_context=512, max_batch=1, cpu_weights="int8",
                           prefix_cache_mb=0), spec=spec)
    h = llm.runner.heads
    assert isinstance(h.head, Int8Linear) and h.head.out_features == 32768
    cfg = default_config("zh")
    prompt = llm.render(render_messages(cfg.template("translate"), TEXTS[2], cfg.lang))
    a = llm.complete(prompt, SamplingParams(max_tokens=32, temperature=0.0))
    b = llm.complete(prompt, SamplingParams(max_tokens=32, temperature=0.0, speculative=True))
    assert a.token_ids == b.token_ids, (a.text, b.text)
    st = speculative.report(llm.runner)["by_source"]["heads"]
    assert st["accepted"] > 0 and st["drafted"] == st["verify_steps"], st  # one draft a step


def test_trainer_end_to_end_on_tiny_settings(tmp_path):
    from engine.draft import train
    out, rep = tmp_path / "t.heads.safetensors", tmp_path / "r.json"
    assert train.main(["--device", "cpu", "--sources", "1", "--max-texts", "3", "--heads", "2", "--epochs", "2",
                       "--batch", "32", "--max-tokens", "16", "--lr", "3e-3", "--held", "2", "--out", str(out),
                       "--report", str(rep)]) == 0
    w, b, meta = H.load(out, 896)
    r = json.loads(rep.read_text())
    assert w.shape == (2, 896, 1792) and meta["heads"] == 2 and r["train_positions"] > 20
    assert r["loss_per_epoch"][1] < r["loss_per_epoch"][0]
    assert set(r["val"]) == {"top1_per_head", "tokens_per_step_chain", "tokens_per_step_tree", "positions"}
    assert r["held_hand_texts"]["texts"] == 2 and r["held_hand_texts"]["after"]["positions"] > 0
    # going on from that file (hand-written sources only, none held out), the loss over the draft vocabulary
    out2, rep2 = tmp_path / "t2.heads.safetensors", tmp_path / "r2.json"
    assert train.main(["--device", "cpu", "--sources", "0", "--max-texts", "3", "--heads", "2", "--epochs", "1",
                       "--batch", "32", "--max-tokens", "16", "--lr", "1e-3", "--held", "0", "--init", str(out),
                       "--vocab-subset", "--out", str(out2), "--report", str(rep2)]) == 0
    r2 = json.loads(rep2.read_text())
    assert r2["init"] == out.name and r2["vocab_subset"]
    w2, _, _ = H.load(out2, 896)  # went on from the first heads: one small epoch moved them a little
    assert (w2.float() - w.float()).norm() < 0.5 * w.float().norm()
    assert r2["held_hand_texts"] == {"texts": 0, "before_training": None, "after": None}


def test_serve_flags_draft_heads_and_decode_chain():
    import argparse

    from engine.server.cli import add_arguments, build_config
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert build_config(p.parse_args([])).draft_heads == "auto"
    assert build_config(p.parse_args(["--draft-heads", "off"])).draft_heads == ""
    assert build_config(p.parse_args(["--draft-heads", "/x/y.heads.safetensors"])).draft_heads == "/x/y.heads.safetensors"
    assert build_config(p.parse_args([])).decode_chain == 16  # the chained greedy steps (GPUModel.decode_chain)
    assert build_config(p.parse_args(["--decode-chain", "0"])).decode_chain == 0
    from engine.errors import BadRequestError
    with pytest.raises(BadRequestError, match="negative"):
        build_config(p.parse_args(["--decode-chain", "-1"]))


def test_burst_and_tree_steps_accept_and_keep_greedy_output(tmp_path):
    """Heads trained (engine/draft/train.py) on a random 2-layer model's own greedy outputs accept most of their
    drafts there; on the GPU step's references, the burst (acceptance on the "GPU", the next step queued) and the
    host-driven tree step both give the plain greedy tokens, with the same acceptance."""
    from engine.draft import train
    from engine.runtime import speculative
    from engine.runtime.draft_heads import DraftHeads
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence
    r = gpu_runner(tmp_path, torch.zeros(4, 256, 512), torch.zeros(4, 256))
    tok = load_spec(str(tmp_path)).tokenizer
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 1024, (12,), generator=g).tolist() for _ in range(4)]

    def generate(speculate: bool) -> list[list[int]]:  # each prompt alone, greedy, 40 tokens
        outs = []
        for p in prompts:
            s = Sequence(p, SamplingParams(max_tokens=40, ignore_eos=True, speculative=speculate), tok)
            r.allocate(s)
            r.prefill(s)
            while not s.finished:
                speculative.decode(r, [s]) if speculate else r.decode([s])
            r.release(s)
            outs.append(s.output_ids)
        return outs
    plain = generate(False)
    rows = [{"prompt_ids": p, "output_ids": o} for p, o in zip(prompts, plain)]
    X, T, Y, L = train.features(r, rows, 4, torch.device("cpu"))
    E = train.head_matrix(r).float()
    ok = L[:, None] > torch.arange(4)  # [N, 4]: head i's target was produced by row r+1+i of the same sequence
    teacher = (torch.arange(len(L))[:, None] + 1 + torch.arange(4))[ok]
    assert ok.sum() > 100 and ((X[teacher].float() @ E.T).argmax(-1) == Y[ok]).float().mean() > 0.95  # greedy
    W, b, _ = train.train(X, T, Y, E, train.embed_matrix(r).float(), 4, 60, 3e-3, 64, L=L, distill=0.5)
    r.heads = DraftHeads(r, W, b, {})
    got = {}
    r.cfg.spec_ngram_min = 99  # no prompt lookup (these outputs repeat themselves): every draft is the heads'
    for burst in (8, 0):
        r.cfg.spec_burst = burst
        r._spec_stats = None
        assert generate(True) == plain, burst
        by = speculative.report(r)["by_source"]
        assert ("tree" in by) == (burst == 0) and ("burst" in by) == (burst > 0), by
        got[burst] = by["burst" if burst else "tree"]
    for v in got.values():  # most drafts right: paths walked, rows moved (the host's tree is cut near the end)
        assert v["accepted"] > 80 and v["tokens_per_step"] > 3.0, got
    # the draft vocabulary: all ids drafts exactly as without one; every other id only: the heads guess inside it,
    # the outputs stay plain greedy ones (the verify is the full lm_head)
    V = r.model.w.lm_head.N
    for vocab, check in ((np.arange(V), "same"), (np.arange(0, V, 2), "even")):
        r.heads = DraftHeads(r, W, b, {}, vocab=vocab)
        r.cfg.spec_burst, r._spec_stats = 8, None
        assert generate(True) == plain, check
        by = speculative.report(r)["by_source"]["burst"]
        if check == "same":
            assert all(by[k] == got[8][k] for k in ("verify_steps", "drafted", "accepted", "tokens")), (by, got[8])
        else:
            assert (r.heads.top_i % 2 == 0).all() and by["accepted"] < got[8]["accepted"], by
    r.cfg.spec_ngram_min, r.cfg.spec_burst, r._spec_stats = 2, 8, None  # prompt lookup back: bursts end early
    assert generate(True) == plain
    by = speculative.report(r)["by_source"]
    # after an accepted lookup draft the next LOOKUP_RECENT steps are host-driven tree steps, not bursts
    assert by["lookup"]["verify_steps"] > 0 and by["tree"]["verify_steps"] > 0 and by["burst"]["verify_steps"] > 0, by


def test_hand_written_texts_are_disjoint_from_the_bench_and_held_out_from_training():
    from engine.bench.draft_texts import HELD_PER_LANGUAGE, hand_texts, train_texts
    from engine.bench.hotpath import TEXTS
    held, tr = hand_texts("held"), hand_texts("train")
    assert len(held) == 2 * HELD_PER_LANGUAGE and len(held) + len(tr) == 320
    assert len(set(held + tr)) == 320 and not set(held + tr) & set(TEXTS) and not set(held) & set(train_texts())
    # zh first, then en (train.py --held takes the first k of each half)
    assert all(any("\u4e00" <= c <= "\u9fff" for c in t) for t in held[:HELD_PER_LANGUAGE])
    assert not any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in held[HELD_PER_LANGUAGE:])
    with pytest.raises(ValueError):
        hand_texts("test")
