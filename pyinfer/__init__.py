"""pyinfer: local LLM inference that computes only the neurons that fire."""
from .api import Model, load
from .errors import ContextOverflowError, ModelFormatError, PyinferError, UnsupportedModelError
from .options import LoadOptions

__version__ = "0.1.0"
__all__ = ["load", "Model", "LoadOptions", "PyinferError", "ModelFormatError", "UnsupportedModelError", "ContextOverflowError"]
