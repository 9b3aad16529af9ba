"""Half precision (float16, bfloat16) and autocast: the one rule every op follows.

- **Compute dtype.** float64 when the floating inputs are all float64; otherwise float32: float16 and
  bfloat16 inputs are cast to float32 on entry (a differentiable cast: their gradients come back in
  their own dtype) and may be mixed with each other and with float32 (bf16 latents with an fp32
  codebook). float64 mixed with any other dtype is a ``TypeError`` naming the arguments.
- **Results.** Tensors that mirror an input (z_q, relaxed samples and one-hots) come back in that
  input's dtype; losses and other reductions (Cliff / KLM terms, KDE grids, KL, codebook losses) in
  the compute dtype. Integer indices stay int64.
- **Autocast.** The ops compute in the compute dtype whatever ``torch.autocast`` says: the functional
  API runs its backend with autocast off, and the raw ``torch.ops.qkernels`` ops cast their floating
  inputs to float32 under autocast (``torch.library.register_autocast``).
- **Where half precision cannot be exact enough**: finite differences. ``finite_difference_curvature``
  and the Hessian penalties reject float16 / bfloat16 activations (``TypeError``): bfloat16 rounds
  each activation by up to 2^-8 of its size (float16: 2^-11), and a second difference divided by
  eps^2 = 0.01 turns that into errors as large as the curvature itself (docs/design/precision.md,
  "Mixed precision"). The penalties call ``fn`` on float32 latents with autocast off, so under
  autocast the penalty pass runs in float32.

Half inputs are cast, not loaded natively by the kernels: one extra elementwise pass over the
inputs (n x d latents: small next to the KDE kernels' work; docs/design/precision.md measures it).
"""

from __future__ import annotations

import contextlib

import torch

from qkernels import _args

HALF = (torch.float16, torch.bfloat16)


def compute_dtype(**tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype an op computes in for these floating inputs (None entries are ignored): the rule both front-ends
    share, :func:`qkernels._args.compute_dtype`."""
    dtypes = {name: str(t.dtype) for name, t in tensors.items() if t is not None}
    return torch.float64 if _args.compute_dtype(dtypes, "{name}.to({dtype})") == "float64" else torch.float32


def upcast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (``t`` itself when it already is: no autograd node)."""
    return t if t.dtype == dtype else t.to(dtype)


def no_autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A context that turns autocast off for ``device``'s type while a backend runs (a no-op
    context when autocast is off: nothing to pay per call)."""
    kind = device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
