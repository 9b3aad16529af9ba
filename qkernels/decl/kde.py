"""Declarations of the KDE hot path's ops (:mod:`qkernels.decl` says what is derived from them).

Semantics: :mod:`qkernels.reference.kde`; the functional API: :mod:`qkernels.ops.kde`.
"""

from qkernels.decl._core import Op, Out, Rule, Scalar, Tensor

_SIGMA = Rule("sigma > 0", {"sigma": 0.0})

KDE_GRID = Op(
    "kde_grid",
    args=(
        Tensor("points", "d, K"),
        Tensor("samples", "n, d"),
        Scalar("sigma", "float", 0.3),
        Scalar("derivative", "bool", True),
    ),
    outputs=(Out("out", "(d, K)"),),
    unnamed_output=True,
    rules=(_SIGMA,),
    sizes={"d": 3, "K": 7, "n": 5},
    backward=Op(
        "kde_grid_backward",
        args=(
            Tensor("grad", "d, K", role="dgrad"),
            Tensor("points", "d, K"),
            Tensor("samples", "n, d"),
            Scalar("sigma", "float", 0.3),
            Scalar("derivative", "bool", True),
        ),
        outputs=(Out("grad_points", "(d, K)"), Out("grad_samples", "(n, d)")),
        rules=(_SIGMA,),
        sizes={"d": 3, "K": 7, "n": 5},
    ),
)

# the whole Cliff criterion of raw latents, standardization, grids and weighting included (one op, so that a backend
# can fuse all of it); the backward recomputes kernel values instead of saving (d, M, n) or (d, d, M, K) tensors
_CLIFF_SCALARS = (
    Scalar("sigma", "float", 0.4),
    Scalar("a", "float", -3.0),
    Scalar("b", "float", 3.0),
    Scalar("num_points", "int", 8),
    Scalar("lambda_uni", "float", 0.5),
    Scalar("lambda_biv", "float", 1.0),
    Scalar("lambda_kl", "float", 0.7),
)
_CLIFF_RULES = (
    Rule("sigma > 0", {"sigma": -1.0}),
    Rule("a < b", {"a": 3.0}),
    Rule("num_points >= 2", {"num_points": 1}),
)
_CLIFF_INPUTS = (Tensor("z", "n, d"), Tensor("cond_index", "d, M", role="index", hi="n"))

CLIFF_LOSS = Op(
    "cliff_loss",
    args=(*_CLIFF_INPUTS, *_CLIFF_SCALARS),
    outputs=(Out("total", "()"), Out("uni", "()"), Out("biv", "()"), Out("kl", "()")),
    rules=_CLIFF_RULES,
    sizes={"n": 6, "d": 3, "M": 2},
    backward=Op(
        "cliff_loss_backward",
        args=(
            *(Tensor(f"grad_{t}", role="grad", optional=True) for t in ("total", "uni", "biv", "kl")),
            *_CLIFF_INPUTS,
            *_CLIFF_SCALARS,
        ),
        outputs=(Out("grad_z", "(n, d)"),),
        rules=_CLIFF_RULES,
        sizes={"n": 6, "d": 3, "M": 2},
    ),
)

# Tripod's KLM (std None: the population std of z + 1e-6, computed by the op) and the per-sample log-sum-exps
# (n, d + 1) its backward reuses (lse carries no gradient)
KLM = Op(
    "klm",
    args=(Tensor("z", "n, d"), Tensor("std", "d", optional=True, example="positive")),
    outputs=(Out("loss", "()"), Out("lse", "(n, d + 1)")),
    sizes={"n": 6, "d": 3},
    backward=Op(
        "klm_backward",
        args=(
            Tensor("grad_loss", role="grad"),
            Tensor("z", "n, d"),
            Tensor("std", "d", optional=True, example="positive"),
            Tensor("lse", "n, d + 1"),
        ),
        outputs=(Out("grad_z", "(n, d)"), Out("grad_std", "(0,) if std is None else (d,)")),
        sizes={"n": 6, "d": 3},
    ),
)

OPS = (KDE_GRID, CLIFF_LOSS, KLM)
