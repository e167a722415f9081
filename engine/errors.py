"""User-facing errors: one line that says what went wrong and how to fix it."""


class DeepInferError(Exception):
    """An error a user can hit (bad model file, too little VRAM, bad request...).

    The CLI prints `str(err)` alone, never a traceback. `fix` is the one-line remedy.
    """

    def __init__(self, message: str, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(f"{message}" + (f" Fix: {fix}" if fix else ""))


class ModelFileError(DeepInferError):
    """Missing, truncated, corrupt or unsupported model file or checkpoint."""


class ContextOverflowError(DeepInferError):
    """Prompt (+ max_tokens) does not fit in the context window."""


class BadRequestError(DeepInferError):
    """Invalid generation parameters."""


class ResourceError(DeepInferError):
    """No GPU, too little VRAM, port busy, etc."""
