"""Colibri: a CPU inference engine for Mixture-of-Experts layers (Python binding)."""
from ._lib import ColibriError, LibraryNotFound, open_library
from .layer import MoELayer, route
from .model import Model, ModelFormatError
from .modelfile import save_model

__all__ = ["ColibriError", "LibraryNotFound", "Model", "ModelFormatError", "MoELayer",
           "open_library", "route", "save_model"]
