"""Declarations of the Hessian hot path's ops (:mod:`qkernels.decl` says what is derived from them).

Semantics: :mod:`qkernels.reference.hessian`; the functional API: :mod:`qkernels.ops.hessian`.
"""

from qkernels.decl._core import Op, Out, Rule, Scalar, Tensor

# the stacked activations (R, M) of n samples: 2 k rows per sample and group, plus optionally the n centers
_FD_SCALARS = (
    Scalar("n", "SymInt", 2),
    Scalar("num_perturbations", "int", 2),
    Scalar("eps", "float", 0.1),
    Scalar("groups", "int", 2),
    Scalar("unbiased", "bool", False),
    Scalar("reduce", "str", "mean"),
)
_FD_RULES = (
    Rule("n >= 1", {"n": 0}),
    Rule("num_perturbations >= 2", {"num_perturbations": 1}),
    Rule("groups in (1, 2)", {"groups": 3}),
    Rule("eps > 0", {"eps": 0.0}),
    Rule("reduce in ('mean', 'max')", {"reduce": "min"}),
    Rule("R - n * 2 * num_perturbations * groups in (0, n)", {"stacked": (10, 3)}),
)

FINITE_DIFFERENCE_CURVATURE = Op(
    "finite_difference_curvature",
    args=(Tensor("stacked", "R, M"), *_FD_SCALARS),
    outputs=(Out("values", "(groups, n)"), Out("argmax", "(groups, n)", "index")),
    rules=_FD_RULES,
    sizes={"R": 16, "M": 3},
    backward=Op(
        "finite_difference_curvature_backward",
        args=(
            Tensor("grad", "groups, n", role="dgrad"),
            Tensor("stacked", "R, M"),
            Tensor("argmax", "groups, n", role="index"),
            *_FD_SCALARS,
        ),
        outputs=(Out("grad_stacked", "(R, M)"),),
        unnamed_output=True,
        rules=_FD_RULES,
        sizes={"R": 16, "M": 3},
    ),
)

# the stacked batch [z + h_1; z - h_1; ...] (2 D n, d) from the raw normal draws (the first `signs` used as Rademacher
# signs) and the scale ("std"; "population": the std of z + 1e-6 inside the op; "one"). No C++ kernels for this op
# and curvature_penalty: with the cpu / cuda curvature op the penalties use their references
_PB_INPUTS = (Tensor("z", "n, d"), Tensor("draws", "D, n, d"), Tensor("std", "d", optional=True, example="positive"))
_PB_SCALARS = (Scalar("eps", "float", 0.1), Scalar("signs", "int", 1), Scalar("scale", "str", "std"))
_PB_RULES = (
    Rule("scale in ('std', 'population', 'one')", {"scale": "unit"}),
    Rule("scale != 'std' or std is not None", {"std": None}),
    Rule("signs >= 0", {"signs": -1}),
    Rule("signs <= D", {"signs": 3}),
    Rule("0 < eps < inf", {"eps": 0.0}),
)

PERTURBED_BATCH = Op(
    "perturbed_batch",
    args=(*_PB_INPUTS, *_PB_SCALARS),
    outputs=(Out("stacked", "(2 * D * n, d)"),),
    unnamed_output=True,
    rules=_PB_RULES,
    sizes={"n": 5, "d": 3, "D": 2},
    backward=Op(
        "perturbed_batch_backward",
        args=(Tensor("grad", "2 * D * n, d", role="dgrad"), *_PB_INPUTS, *_PB_SCALARS),
        outputs=(Out("grad_z", "(n, d)"), Out("grad_std", "(d,)")),
        rules=_PB_RULES,
        sizes={"n": 5, "d": 3, "D": 2},
    ),
)

# NHP's mean_i num_i / (den_i + 1e-10) (ratio) or HP's max / mean over samples; (n,) with reduction "none"
_CP_SCALARS = (Scalar("ratio", "bool", True), Scalar("reduction", "str", "mean"))
_CP_RULES = (
    Rule("groups == (2 if ratio else 1)", {"ratio": False}),
    Rule("reduction in ('mean', 'max', 'none')", {"reduction": "sum"}),
)
_PENALTY = "(n,) if reduction == 'none' else ()"

CURVATURE_PENALTY = Op(
    "curvature_penalty",
    args=(Tensor("values", "groups, n", example="uniform"), *_CP_SCALARS),
    outputs=(Out("penalty", _PENALTY),),
    unnamed_output=True,
    rules=_CP_RULES,
    sizes={"groups": 2, "n": 5},
    backward=Op(
        "curvature_penalty_backward",
        args=(Tensor("grad", _PENALTY, role="dgrad"), Tensor("values", "groups, n", example="uniform"), *_CP_SCALARS),
        outputs=(Out("grad_values", "(groups, n)"),),
        unnamed_output=True,
        rules=_CP_RULES,
        sizes={"groups": 2, "n": 5},
    ),
)

OPS = (FINITE_DIFFERENCE_CURVATURE, PERTURBED_BATCH, CURVATURE_PENALTY)
