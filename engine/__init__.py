"""DeepInfer engine: Qwen2 inference (CPU reference path, GPU kernels), model store, server."""
__version__ = "0.1.0"
