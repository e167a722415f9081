"""The GPU decode step (engine/model/gpu_model.py) run on the CPU with the kernels' PyTorch references
(kernels/decode_reference.RefKernels): same logits and greedy tokens as the CPU runner, batched decode
equal to single decode. Runs everywhere (no CUDA, no CuPy); the device runs the real kernels."""

from engine.config import EngineConfig, ModelConfig


def test_step_on_references_matches_cpu_runner(tmp_path):
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.quant.make_random import make_random
    from engine.runtime.cpu_runner import CPURunner
    from engine.formats.load import load_spec

    cfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    make_random(cfg, "w3", tmp_path, seed=2)
    spec = load_spec(str(tmp_path))
    cpu = CPURunner(spec, EngineConfig(model=str(tmp_path), device="cpu", max_context=64, max_batch=1))
    m = GPUModel(load_checkpoint(spec.checkpoint, "cpu"), 2, 64, "cpu")
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
