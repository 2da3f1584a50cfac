"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class PyinferError(Exception):
    """An error caused by the user's input (model file, prompt, arguments), not by a bug."""


class ModelFormatError(PyinferError):
    """The model file is missing, is not GGUF, is truncated or is malformed."""


class UnsupportedModelError(PyinferError):
    """The file is valid GGUF but uses an architecture, tokenizer or tensor type we do not run."""


class ContextOverflowError(PyinferError):
    """The prompt (plus requested output) does not fit the context window."""
