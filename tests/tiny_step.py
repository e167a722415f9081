"""A tiny random checkpoint (vocab 1024, hidden 256, 2 layers, GQA 4:2) and the GPU decode step's GPUModel on it: on
the CPU it runs the kernels' references (kernels/decode_reference.RefKernels), on "cuda" the real kernels. Shared by
tests/test_gpu_step_reference.py and the GPU tests that repeat its checks on the device."""
from engine.config import ModelConfig

TINY = dict(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2)


def tiny_step_model(tmp_path, device: str = "cpu", scheme: str = "w4", seed: int = 5, slots: int = 2,
                    ctx: int = 64):
    """(its ModelSpec, a GPUModel of `slots` KV slots of `ctx` rows); the environment's DEEPINFER_* settings apply."""
    from engine.formats.load import load_spec
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.quant.make_random import make_random

    make_random(ModelConfig(**TINY), scheme, tmp_path, seed=seed)
    spec = load_spec(str(tmp_path))
    return spec, GPUModel(load_checkpoint(spec.checkpoint, device), slots, ctx, device)
