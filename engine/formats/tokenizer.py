"""Qwen2 byte-level BPE tokenizer (built from GGUF tokens/merges or read from tokenizer.json)
and an incremental detokenizer that never emits a broken UTF-8 character (seed article 5.18)."""
from __future__ import annotations

import gzip
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers

from engine.assets_path import asset

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


class Tokenizer:
    def __init__(self, tok: HFTokenizer, eos_token_ids: list[int] | None = None):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.im_start_id = tok.token_to_id(IM_START)
        self.im_end_id = tok.token_to_id(IM_END)
        self.endoftext_id = tok.token_to_id(ENDOFTEXT)
        eos = set(eos_token_ids or [])
        eos |= {i for i in (self.im_end_id, self.endoftext_id) if i is not None}
        self.eos_token_ids = sorted(eos)

    # --- construction --------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, tokens: list[str], merges: list[str], token_types: list[int],
                  eos_token_ids: list[int] | None = None) -> "Tokenizer":
        vocab = {t: i for i, t in enumerate(tokens)}
        merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False)
        tok = HFTokenizer(bpe)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        # GGUF token types: 1 normal, 3 control, 4 user-defined (<|im_start|>, <tool_call>, ...)
        added = [AddedToken(tokens[i], special=True, normalized=False)
                 for i, ty in enumerate(token_types) if ty in (3, 4)]
        tok.add_special_tokens(added)
        return cls(tok, eos_token_ids)

    @classmethod
    def from_file(cls, path: str | Path, eos_token_ids: list[int] | None = None) -> "Tokenizer":
        return cls(HFTokenizer.from_file(str(path)), eos_token_ids)

    def save(self, path: str | Path):
        self.tok.save(str(path))

    # --- use -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Text -> ids. ChatML special tokens written in the text are recognised. encode_batch releases the
        GIL while the Rust tokenizer runs (encode does not): a 16k-token prompt tokenized by an HTTP
        handler thread must not stall the engine thread and the streams (tests/test_core_tokenizer.py)."""
        return self.tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that are always complete UTF-8.

    Byte-level BPE can split one Chinese character over two tokens; decoding the prefix then
    ends in U+FFFD. We only emit text up to (not including) a trailing U+FFFD and wait for
    the next token to complete the character. Decoding restarts from a small window of
    recent tokens so the cost per token stays constant.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] already emitted, used as context
        self.read_offset = 0
        self.text = ""  # everything emitted so far

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        dec = self.tokenizer.decode
        prefix = dec(self.ids[self.prefix_offset:self.read_offset], self.skip_special)
        full = dec(self.ids[self.prefix_offset:], self.skip_special)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            # incomplete character (or nothing new yet): wait for more tokens
            return ""
        delta = full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: whatever is left (a truly invalid byte stays U+FFFD)."""
        dec = self.tokenizer.decode
        prefix = dec(self.ids[self.prefix_offset:self.read_offset], self.skip_special)
        full = dec(self.ids[self.prefix_offset:], self.skip_special)
        delta = full[len(prefix):] if len(full) > len(prefix) else ""
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta


def bundled_qwen2_tokenizer() -> Tokenizer:
    """The Qwen2.5 tokenizer shipped in assets/ (for random-weight checkpoints)."""

    with gzip.open(asset("qwen2_tokenizer.json.gz"), "rt", encoding="utf-8") as f:
        return Tokenizer(HFTokenizer.from_str(f.read()))
