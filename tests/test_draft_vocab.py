"""The draft vocabulary (engine/draft/vocab.py): the bundled subset's shape and contents, and how it is built."""
from __future__ import annotations

import numpy as np

from engine.draft import vocab
from engine.formats.tokenizer import bundled_qwen2_tokenizer


def test_bundled_vocabulary_is_a_sorted_subset_with_the_tokens_every_answer_needs():
    ids = vocab.load(vocab.QWEN2_VOCAB)
    assert ids is not None and len(ids) == 32768 and len(ids) % 64 == 0  # the GEMV's tile
    assert ids.dtype == np.int64 and np.all(np.diff(ids) > 0) and ids.max() < vocab.QWEN2_VOCAB
    tok = bundled_qwen2_tokenizer()
    have = set(ids.tolist())
    must = set(range(256)) | {151643, 151644, 151645}  # bytes, <|endoftext|>, <|im_start|>, <|im_end|>
    for text in (" the", " meeting", " Friday", "，", "。", "明天", "会议", "\n\n", " report"):
        must |= set(tok.encode(text))
    assert must <= have, sorted(must - have)
    assert vocab.load(1024) is None  # another tokenizer: the heads draft over everything


def test_build_ranks_tokens_by_word_frequency_and_keeps_the_must_haves():
    tok = bundled_qwen2_tokenizer()
    en = [("the", 0.05), ("meeting", 0.001), ("zyzzyva", 1e-9)]
    zh = [("会议", 0.01), ("的", 0.05)]
    size = 64 * ((256 + 40 + 63) // 64)
    ids = vocab.build(tok, en, zh, size)
    got = set(ids.tolist())
    assert len(ids) == len(got) and np.all(np.diff(ids) > 0)
    assert set(tok.encode(" the")) <= got and set(tok.encode("的")) <= got and set(range(256)) <= got
    w = vocab.token_weights(tok, en, zh)
    assert w[tok.encode(" the")[0]] > w[tok.encode(" meeting")[0]]
    assert vocab.coverage(np.array([1, 2]), [[1, 2, 3, 4]]) == 0.5
