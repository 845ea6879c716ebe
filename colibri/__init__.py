"""Colibri: a CPU inference engine for Mixture-of-Experts layers (Python binding)."""
from ._lib import ColibriError, LibraryNotFound, open_library
from .layer import MoELayer, route
from .linear import Linear
from .model import Model, ModelFormatError
from .modelfile import save_model

__all__ = ["ColibriError", "Linear", "LibraryNotFound", "Model", "ModelFormatError", "MoELayer",
           "open_library", "route", "save_model"]
