"""Modules to drop into existing models."""

from qkernels.nn.quantize import FSQ, CategoricalLatent, GumbelQuantizer, LatentQuantizer

__all__ = ["FSQ", "CategoricalLatent", "GumbelQuantizer", "LatentQuantizer"]
