"""Declarations of the quantization hot path's ops (:mod:`qkernels.decl` says what is derived from them).

A codebook ``values`` is (G, n_v) with G = 1 (one global codebook) or G = d (one per latent). Semantics:
:mod:`qkernels.reference.quantize`; the functional API: :mod:`qkernels.ops.quantize`.
"""

from qkernels.decl._core import Op, Out, Rule, Scalar, Tensor

_CODEBOOK = Rule("G in (1, d)", {"values": (4, 4)})  # G = 4 with d = 3 in the examples
_LQ_SIZES = {"N": 5, "d": 3, "G": 3, "n_v": 4}

LATENT_QUANTIZE = Op(
    "latent_quantize",
    args=(Tensor("z", "N, d"), Tensor("values", "G, n_v")),
    outputs=(
        Out("z_q", "(N, d)"),
        Out("indices", "(N, d)", "index"),
        Out("loss_quantize", "()"),
        Out("loss_commit", "()"),
    ),
    rules=(_CODEBOOK,),
    sizes=_LQ_SIZES,
    backward=Op(
        "latent_quantize_backward",
        args=(
            Tensor("grad_z_q", "N, d", role="dgrad"),
            Tensor("grad_loss_quantize", role="grad"),
            Tensor("grad_loss_commit", role="grad"),
            Tensor("z", "N, d"),
            Tensor("values", "G, n_v"),
            Tensor("indices", "N, d", role="index", hi="n_v"),
        ),
        outputs=(Out("grad_z", "(N, d)"), Out("grad_values", "(G, n_v)")),
        rules=(_CODEBOOK,),
        sizes=_LQ_SIZES,
    ),
)

_CAT_SIZES = {"N": 5, "d": 3, "G": 1, "K": 4}
_RC_SCALARS = (Scalar("tau", "float", 0.7), Scalar("noise_scale", "float", 1.0))
_RC_INPUTS = (
    Tensor("logits", "N, d, K"),
    Tensor("values", "G, K"),
    Tensor("uniform", "N, d, K", optional=True, example="uniform"),
)

RELAXED_CATEGORICAL = Op(
    "relaxed_categorical",
    args=(*_RC_INPUTS, *_RC_SCALARS, Scalar("hard", "bool", False)),
    outputs=(Out("z", "(N, d)"), Out("y", "(N, d, K)"), Out("kl", "(N, d)")),
    rules=(_CODEBOOK,),
    sizes=_CAT_SIZES,
    backward=Op(
        "relaxed_categorical_backward",
        args=(
            Tensor("grad_z", "N, d", role="dgrad"),
            Tensor("grad_y", "N, d, K", role="dgrad"),
            Tensor("grad_kl", "N, d", role="dgrad"),
            *_RC_INPUTS,
            Tensor("y", "N, d, K"),
            *_RC_SCALARS,
        ),
        outputs=(Out("grad_logits", "(N, d, K)"), Out("grad_values", "(G, K)")),
        rules=(_CODEBOOK,),
        sizes=_CAT_SIZES,
    ),
)

# relaxed_categorical of logits = -(z - values)^2. No C++ kernel: a cpu / cuda backend composes torch logits with its
# relaxed_categorical kernel
_GQ_INPUTS = (
    Tensor("z", "N, d"),
    Tensor("values", "G, K"),
    Tensor("uniform", "N, d, K", optional=True, example="uniform"),
)
_TAU = Rule("tau > 0", {"tau": 0.0})

GUMBEL_QUANTIZE = Op(
    "gumbel_quantize",
    args=(*_GQ_INPUTS, Scalar("tau", "float", 0.7), Scalar("hard", "bool", False)),
    outputs=(Out("z_q", "(N, d)"), Out("y", "(N, d, K)"), Out("logits", "(N, d, K)"), Out("kl", "(N, d)")),
    rules=(_CODEBOOK, _TAU),
    sizes=_CAT_SIZES,
    backward=Op(
        "gumbel_quantize_backward",
        args=(
            Tensor("grad_z_q", "N, d", role="dgrad", optional=True),
            Tensor("grad_y", "N, d, K", role="dgrad", optional=True),
            Tensor("grad_logits", "N, d, K", role="dgrad", optional=True),
            Tensor("grad_kl", "N, d", role="dgrad", optional=True),
            *_GQ_INPUTS,
            Tensor("y", "N, d, K"),
            Scalar("tau", "float", 0.7),
        ),
        outputs=(Out("grad_z", "(N, d)"), Out("grad_values", "(G, K)")),
        rules=(_CODEBOOK, _TAU),
        sizes=_CAT_SIZES,
    ),
)

OPS = (LATENT_QUANTIZE, RELAXED_CATEGORICAL, GUMBEL_QUANTIZE)
