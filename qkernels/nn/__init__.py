"""Modules to drop into existing models."""

from qkernels.nn.hessian import HessianPenalty, NormalizedHessianPenalty
from qkernels.nn.quantize import FSQ, CategoricalLatent, GumbelQuantizer, LatentQuantizer

__all__ = [
    "FSQ",
    "CategoricalLatent",
    "GumbelQuantizer",
    "HessianPenalty",
    "LatentQuantizer",
    "NormalizedHessianPenalty",
]
