"""Op declarations: each op's signature written once, framework-free (no torch, no jax).

A hot path's module (:mod:`qkernels.decl.kde`, :mod:`~qkernels.decl.quantize`, :mod:`~qkernels.decl.hessian`)
declares its ops as :class:`Op` values: name; arguments with shapes, dtypes and constraints; outputs; the backward
op. Everything else about an op's signature is derived from them:

- the schema string (:meth:`Op.schema`), which ``csrc/schemas.cpp`` must spell identically (a test diffs them) and
  the Triton custom ops are registered with;
- the fake (meta) implementations: output shapes and dtypes (:meth:`Op.output_shapes`);
- the raw-argument checks of the Triton ops and of the JAX front-end (:meth:`Op.check`);
- the autograd formula's wiring: which inputs and outputs the backward op reads, which of its outputs is whose
  gradient (:class:`Backward`);
- the raw-op test's valid example calls and bad-input cases (:meth:`Op.example`, :class:`Rule` counterexamples);
- the JAX FFI targets (one per op, named as the op).

Naming conventions the derivations rely on: a backward op's argument ``grad_<o>`` is the upstream gradient of the
forward output ``o`` (``grad``: of the forward's one non-index output), an argument named like a forward input or
output is that value (saved by the forward), and its output ``grad_<i>`` is the gradient of the forward input ``i``.
A forward output without a gradient argument is not differentiable.
"""

from qkernels.decl import hessian, kde, quantize
from qkernels.decl._core import (
    FLOAT_DTYPES,
    ROLES,
    SCALAR_TYPES,
    Backward,
    Framework,
    Op,
    Out,
    Rule,
    Scalar,
    Tensor,
    backward_wiring,
)

__all__ = [
    "FLOAT_DTYPES",
    "ROLES",
    "SCALAR_TYPES",
    "Backward",
    "Framework",
    "Op",
    "Out",
    "Rule",
    "Scalar",
    "Tensor",
    "all_ops",
    "backward_wiring",
    "by_name",
    "hessian",
    "kde",
    "quantize",
]


def all_ops() -> tuple[Op, ...]:
    """Every declared forward op, hot path by hot path (their backward ops hang off them)."""
    return (*quantize.OPS, *kde.OPS, *hessian.OPS)


def by_name() -> dict[str, Op]:
    """Every declared op, backward ops included, by name."""
    out: dict[str, Op] = {}
    for op in all_ops():
        out[op.name] = op
        if op.backward is not None:
            out[op.backward.name] = op.backward
    return out
