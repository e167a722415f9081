"""Self-generated calibration text (engine/quant/selfcalib.py): the model's own sampled answers to the built-in
requests, seeded (the same text twice), cached on disk, and fed to the calibrator after the bundled text."""
from __future__ import annotations

from engine.config import ModelConfig

CFG = ModelConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2)


def test_generated_segments_are_seeded_cached_and_calibrate(tmp_path, monkeypatch):
    from engine.formats.load import load_spec
    from engine.quant import selfcalib
    from engine.quant.calibrate import SEGMENT, calibration_ids
    from engine.quant.make_random import make_random

    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path / "models"))
    make_random(CFG, "fp16", tmp_path / "m", seed=3)
    spec = load_spec(str(tmp_path / "m"))
    segs = selfcalib.generated_segments(spec, tokens=200, seq_len=64, batch=4)
    assert sum(len(s) for s in segs) >= 200 and all(len(s) <= 64 for s in segs)
    assert selfcalib.REQUESTS[0] in spec.tokenizer.decode(segs[0])  # a request as a chat turn, then the answer
    path = selfcalib.cache_path(spec, 200, 64)
    assert path.is_file()
    path.unlink()
    assert selfcalib.generated_segments(spec, tokens=200, seq_len=64, batch=4) == segs  # seeded: the same text
    assert selfcalib.generated_segments(spec, tokens=200, seq_len=64, batch=4) == segs  # and from the cache
    ids = calibration_ids(spec.tokenizer, vocab=CFG.vocab_size, extra=segs)
    assert ids[:len(segs)] == [s[:SEGMENT] for s in segs if len(s) >= 16]
    assert len(ids) > len(segs)  # the bundled text follows
