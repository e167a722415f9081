"""engine/runtime/grammar.py + logits.py without a model: the bundled Qwen2.5 tokenizer, random logits.
Any logits, masked by the grammar, give schema-valid JSON; the GPU mask equals the CPU one."""
from __future__ import annotations

import json

import pytest
import torch

from engine.errors import BadRequestError
from engine.formats.tokenizer import bundled_qwen2_tokenizer
from engine.runtime import grammar
from engine.runtime.logits import pick, process
from engine.runtime.sampling import SamplingParams, sample
from engine.runtime.sequence import Sequence

N_VOCAB = 151936
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
                                           "tag": {"type": "string", "enum": ["a", "b"]}},
          "required": ["ok", "n", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok():
    return bundled_qwen2_tokenizer()


def test_random_logits_still_give_valid_json(tok):
    g = grammar.compile_json(tok, N_VOCAB, SCHEMA)
    gen = torch.Generator().manual_seed(0)
    for seed in range(3):
        seq = Sequence([1, 2, 3], SamplingParams(max_tokens=64, temperature=1.0, seed=seed, grammar=g), tok)
        while not seq.finished:
            seq.append(pick(torch.randn(N_VOCAB, generator=gen) * 5, seq, sample), set(tok.eos_token_ids))
        assert seq.finish_reason == "stop"
        obj = json.loads(seq.text)
        assert set(obj) == {"ok", "n", "tag"} and isinstance(obj["ok"], bool) and obj["tag"] in ("a", "b")


def test_mask_allows_only_grammar_tokens(tok):
    g = grammar.compile_json(tok, N_VOCAB, None, "json_object")
    seq = Sequence([1], SamplingParams(max_tokens=8, grammar=g, logprobs=2), tok)
    x = process(torch.zeros(N_VOCAB), seq)
    allowed = torch.isfinite(x).nonzero().view(-1).tolist()
    assert allowed and all(tok.decode([t]).lstrip().startswith("{") for t in allowed)
    t = pick(torch.zeros(N_VOCAB), seq, sample)
    assert seq.logprobs[0][0] == t and len(seq.logprobs[0][2]) == 2


def test_bad_schema_and_tool_choice(tok):
    with pytest.raises(BadRequestError):
        grammar.compile_json(tok, N_VOCAB, {"type": "object", "$ref": "#/definitions/missing"})
    with pytest.raises(BadRequestError):
        grammar.tool_call_schema([{"type": "function", "function": {"name": "a"}}], "b")


@pytest.mark.gpu
def test_gpu_mask_equals_cpu(tok):
    g = grammar.compile_json(tok, N_VOCAB, SCHEMA)
    cpu, gpu = grammar.Matcher(g), grammar.Matcher(g)
    for t in tok.encode('{"ok":true,"n":12,'):
        assert torch.equal(cpu.allowed("cpu"), gpu.allowed(torch.device("cuda")).cpu())
        assert cpu.accept(t) and gpu.accept(t)
