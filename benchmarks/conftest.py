"""Benchmarks share the case definitions of ``qkernels bench`` (qkernels/bench/<hotpath>.py)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "0")
