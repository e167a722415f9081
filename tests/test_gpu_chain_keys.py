"""Chained greedy steps on the GPU (pytest -m gpu): GPUModel.decode_chain with the argmax keys copied behind each
chained graph ("copy") or written into pinned host memory by the chain step's own last kernel ("kernel",
decode_misc.cu keys_host) gives the host loop's tokens, from even and odd first positions (the host row is the
cache row's parity), in the short and the long-context (merge launch) graphs, and resumed from the step a chain ran
ahead. The same on the references:
tests/test_gpu_step_reference.py. Skipped without CUDA."""
import pytest

from tiny_step import batch_sampled_outputs, check_chain_ahead, sampled_outputs, tiny_step_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("merge_from", ["4096", "8"])
@pytest.mark.parametrize("keys", ["kernel", "copy"])
def test_chain_keys_give_the_host_loops_tokens(tmp_path, monkeypatch, keys, merge_from):
    monkeypatch.setenv("DEEPINFER_CHAIN_KEYS", keys)
    monkeypatch.setenv("DEEPINFER_ATTN_MERGE_FROM", merge_from)
    _, m = tiny_step_model(tmp_path, "cuda", ctx=128)
    assert m.chain_keys == keys
    for prompts in ([list(range(40, 52)), list(range(300, 307))],  # row 0 starts at an even position
                    [list(range(60, 73)), list(range(500, 510))]):  # and at an odd one
        firsts = [int(m.prefill(p, s, 0).argmax()) for s, p in enumerate(prompts)]
        pos = [len(p) for p in prompts]
        toks = [firsts]
        for i in range(10):
            toks.append(m.decode(toks[-1], [p + i for p in pos], [0, 1])[0])
        got = []
        assert m.decode_chain(firsts, pos, [0, 1], 10, lambda ids: got.append(ids) or True) == 10
        assert got == toks[1:]
        got = []  # stopped after 3: the step queued past it is harmless, plain steps go on with the same tokens
        assert m.decode_chain(firsts, pos, [0, 1], 10, lambda ids: got.append(ids) or len(got) < 3) == 3
        assert got == toks[1:4]
        assert [m.decode(toks[i], [p + i for p in pos], [0, 1])[0] for i in range(3, 6)] == toks[4:7]


@pytest.mark.parametrize("keys", ["kernel", "copy"])
def test_chain_resumes_from_the_step_it_ran_ahead_on_the_gpu(tmp_path, monkeypatch, keys):
    """decode_chain(..., ahead=True) with the graphs: the step queued ahead is resumed from (the host loop's tokens)
    and dropped by a step in between (tests/tiny_step.py check_chain_ahead; the default, DEEPINFER_CHAIN_AHEAD)."""
    monkeypatch.setenv("DEEPINFER_CHAIN_KEYS", keys)
    _, m = tiny_step_model(tmp_path, "cuda", ctx=128)
    assert m.chain_ahead
    check_chain_ahead(m, monkeypatch)


def test_one_step_chains_of_a_batch_resume_from_the_step_run_ahead(tmp_path, monkeypatch):
    """GPURunner._decode_batch_ahead's model calls with the graphs: two sequences take one-step chains with ahead, each
    next call resuming from the step run ahead; the tokens are the host loop's (GPUModel.decode)."""
    _, m = tiny_step_model(tmp_path, "cuda", ctx=128)
    prompts = [list(range(40, 52)), list(range(300, 307))]
    firsts = [int(m.prefill(p, s, 0).argmax()) for s, p in enumerate(prompts)]
    pos = [len(p) for p in prompts]
    toks = [firsts]
    for i in range(8):
        toks.append(m.decode(toks[-1], [p + i for p in pos], [0, 1])[0])
    before = dict(m.ahead_stats)
    got = [firsts]
    for i in range(8):
        m.decode_chain(got[-1], [p + i for p in pos], [0, 1], 1, lambda ids: got.append(ids) or True, ahead=i < 7)
    assert got == toks and m.ahead_stats["resumed"] - before["resumed"] == 7


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (20, 1.0)])
def test_a_sampling_request_chains_with_the_host_paths_tokens_on_the_gpu(tmp_path, monkeypatch, top_k, top_p):
    """The runner's sampled chains on the GPU (each draw a captured graph of sampling.sample's ops after the step,
    chain_sampler.py): the seed's tokens and the generator's end state equal one host round trip per token's."""
    plain, u_plain, stats = sampled_outputs(tmp_path / "plain", monkeypatch, False, top_k, top_p, "cuda")
    assert stats == {"chains": 0, "tokens": 0} and len(plain) == 23
    chained, u_chained, stats = sampled_outputs(tmp_path / "chain", monkeypatch, True, top_k, top_p, "cuda")
    assert chained == plain and u_chained == u_plain and stats == {"chains": 5, "tokens": 22}


def test_batched_sampling_rows_drawn_behind_the_step_on_the_gpu(tmp_path, monkeypatch):
    """A batched step's sampling rows drawn on the GPU behind it, without a wait per row (ChainSampler.draw_rows):
    the tokens and generator states of sample() after the step."""
    off = batch_sampled_outputs(tmp_path / "off", monkeypatch, False, "cuda")
    on = batch_sampled_outputs(tmp_path / "on", monkeypatch, True, "cuda")
    assert on == off and [len(o) for o in on[0]] == [12, 9, 10]
