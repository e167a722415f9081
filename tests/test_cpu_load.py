"""The GGUF reader decodes the next tensors in a small pool while the loader places the current one
(engine/formats/gguf_reader.py _dequantized): the same arrays in the same order, an error at its own tensor's turn,
and a loader that stops early (a shape error) leaves no work behind."""
from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from engine.errors import ModelFileError
from engine.formats.gguf_reader import _dequantized


def _first(spec, n):
    return dict(itertools.islice(spec.gguf_tensors.items(), n))


def test_pool_gives_the_serial_arrays_in_order(spec):
    names = _first(spec, 9)  # the embedding (the largest), norms, K-quant and Q8_0 linears of layer 0
    got = list(_dequantized(names))
    assert [n for n, _ in got] == list(names)
    for (n, t), g in zip(names.items(), got):
        assert np.array_equal(g[1].numpy(), t.dequantize()), n
        assert g[1].numpy().flags.writeable  # fresh arrays (never the mapped file): a load may keep them


class _Damaged:
    def dequantize(self):
        raise ModelFileError("a damaged block")


def test_an_error_raises_at_its_own_turn_and_an_early_stop_is_clean(spec):
    names = _first(spec, 3)
    bad = {**names, "damaged": _Damaged(), **dict(itertools.islice(spec.gguf_tensors.items(), 3, 6))}
    it = _dequantized(bad)
    assert [next(it)[0] for _ in range(3)] == list(names)  # the ones before it arrive first
    with pytest.raises(ModelFileError, match="damaged"):
        next(it)
    before = threading.active_count()
    it = _dequantized(_first(spec, 8))
    next(it)
    it.close()  # the loader stopped (a shape mismatch): the pool ends, nothing keeps running
    assert threading.active_count() <= before
