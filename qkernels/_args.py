"""Argument rules of the public functions, written once for both front-ends (torch: :mod:`qkernels.ops`, JAX:
:mod:`qkernels.jax`): pure Python on numbers, shapes (tuples of ints) and dtype names; no torch, no jax.

Each rule raises a ``TypeError`` (a wrong kind of value) or ``ValueError`` (a wrong value) naming the argument and
what was expected. Tensor-specific checks (devices, NaN / inf values) are each front-end's own
(:mod:`qkernels._validation`, :mod:`qkernels.jax._checks`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

HALF_DTYPES = ("float16", "bfloat16")


# ----------------------------------------------------------------------------- numbers


def is_finite_number(x: float) -> bool:
    """Whether the number ``x`` is finite (comparisons, not math.isfinite: torch.compile traces them
    when ``x`` is a symbolic float)."""
    return -math.inf < x < math.inf


def not_a_number(name: str, value: object, kind: str = "a number") -> TypeError:
    """The error for an option ``name`` that is not a Python number (``kind``: "a number", "an int"): an array or
    tensor is told why (options are fixed when an op is traced or compiled) and how to pass one."""
    why = ""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        why = (
            f": options such as {name} are Python numbers (int or float), fixed when the op is traced or compiled, "
            f"not arrays or tensors; pass float({name}) (outside jax.jit / torch.compile: a traced value has none)"
        )
    return TypeError(f"{name} must be {kind}, got {type(value).__name__}{why}")


def check_positive(name: str, value: object, *, integer: bool = False, minimum: float | None = None) -> None:
    """A positive number (``> 0``), or ``>= minimum`` when given."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise not_a_number(name, value, "an int" if integer else "a number")
    if minimum is not None:
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    elif not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_numbers(**values: object) -> None:
    """Each keyword a (Python) number, e.g. the loss weights ``lambda_uni=...``."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise not_a_number(name, value)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_sigma(sigma: float) -> float:
    """A finite bandwidth > 0, as a float."""
    check_positive("sigma", sigma)
    if not is_finite_number(sigma):
        raise ValueError(f"sigma must be finite, got {sigma}")
    return float(sigma)


def check_grid(grid: object) -> tuple[float, float, int]:
    """An integration grid (a, b, K): finite a < b, integer K >= 2."""
    if not (isinstance(grid, (tuple, list)) and len(grid) == 3):
        raise TypeError(f"grid must be a tuple (a, b, K), got {grid!r}")
    a, b, k = grid
    for name, val in (("grid[0] (a)", a), ("grid[1] (b)", b)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not is_finite_number(val):
            raise TypeError(f"{name} must be a finite number, got {val!r}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"grid[2] (K) must be an int, got {k!r}")
    if k < 2:
        raise ValueError(f"grid[2] (K) must be >= 2, got {k}")
    if not a < b:
        raise ValueError(f"grid must have a < b, got a = {a}, b = {b}")
    return float(a), float(b), k


def check_levels(levels: object, d: int) -> list[int]:
    """FSQ levels given as an int or a sequence of ints: 1 or ``d`` of them, each >= 2."""
    if isinstance(levels, int) and not isinstance(levels, bool):
        values = [levels]
    elif isinstance(levels, Sequence) and all(isinstance(v, int) and not isinstance(v, bool) for v in levels):
        values = list(levels)
    else:
        raise TypeError(f"levels must be an int or a sequence of ints, got {levels!r}")
    if len(values) not in (1, d):
        raise ValueError(f"levels must give 1 or d = {d} values, got {len(values)}")
    if min(values) < 2:
        raise ValueError(f"levels must all be >= 2, got {values}")
    return values


def check_std_number(std: float) -> float:
    """One scale for every latent: a finite number > 0."""
    if not (std > 0 and is_finite_number(std)):
        raise ValueError(f"std must be a finite number > 0, got {std}")
    return float(std)


def check_eps(eps: float) -> float:
    """A finite finite-difference step > 0, as a float."""
    check_positive("eps", eps)
    if not is_finite_number(eps):
        raise ValueError(f"eps must be finite, got {eps}")
    return float(eps)


def check_perturbations(num_perturbations: int, eps: float) -> tuple[int, float]:
    """The Hessian penalties' k (>= 2: a variance needs two) and step eps (:func:`check_eps`)."""
    check_positive("num_perturbations", num_perturbations, integer=True)
    if num_perturbations < 2:
        raise ValueError(f"num_perturbations must be >= 2 (a variance needs two), got {num_perturbations}")
    return int(num_perturbations), check_eps(eps)


# ----------------------------------------------------------------------------- shapes and dtypes


def check_curvature(
    rows: int, n: int, num_perturbations: int, eps: float, groups: int, reduce: str
) -> tuple[int, float]:
    """finite_difference_curvature's arguments for a stacked batch of ``rows`` rows: n 2k groups perturbed rows (or
    n more, the center rows first); returns (k, eps)."""
    check_positive("n", n, integer=True)
    k, eps = check_perturbations(num_perturbations, eps)
    if groups not in (1, 2):
        raise ValueError(f"groups must be 1 or 2, got {groups!r}")
    check_choice("reduce", reduce, ("mean", "max"))
    p = n * 2 * k * groups
    if rows not in (p, p + n):
        raise ValueError(
            f"stacked must have n * 2 * num_perturbations * groups = {p} rows (or {p + n} with the "
            f"center rows), got {rows}"
        )
    return k, eps


def check_latents(shape: Sequence[int]) -> tuple[int, int]:
    """Latents z (n, d) with n >= 2 samples and d >= 1 latents (KDE losses); returns (n, d)."""
    if len(shape) != 2:
        raise ValueError(f"z must be 2-D (n, d), got shape {tuple(shape)}")
    n, d = shape
    if n < 2:
        raise ValueError(f"z must hold n >= 2 samples (rows), got shape {tuple(shape)}")
    if d < 1:
        raise ValueError(f"z must hold d >= 1 latents (columns), got shape {tuple(shape)}")
    return n, d


def check_points_and_samples(points: Sequence[int], samples: Sequence[int]) -> None:
    """kde_grid's points (d, K) and samples (n, d) (both 2-D) share d."""
    if samples[1] != points[0]:
        raise ValueError(
            f"samples must be (n, d) with d = {points[0]} (points' first dimension), got shape {tuple(samples)}"
        )


def check_num_cond(num_cond: int, n: int) -> None:
    """Cliff's M conditioning rows drawn without replacement from n."""
    check_positive("num_cond", num_cond, integer=True)
    if num_cond > n:
        raise ValueError(f"num_cond must be <= n = {n} (rows are drawn without replacement), got {num_cond}")


def check_cond_index(shape: Sequence[int], d: int) -> None:
    """Cliff's given conditioning rows: (d, M), M >= 1."""
    if len(shape) != 2 or shape[0] != d or shape[1] < 1:
        raise ValueError(f"cond_index must be (d, M) = ({d}, M >= 1), got shape {tuple(shape)}")


def check_std_shape(shape: Sequence[int], d: int) -> None:
    """Per-latent scales: 0-d (one for every latent) or (d,)."""
    if not (len(shape) == 0 or (len(shape) == 1 and shape[0] == d)):  # no tuple in tuples: torch.compile traces it
        raise ValueError(f"std must be a scalar or (d,) with d = {d}, got shape {tuple(shape)}")


def check_codebook(name: str, values: Sequence[int], d: int, z: Sequence[int] | None = None) -> None:
    """A scalar codebook ``values``: (n_v,) (global) or (d, n_v) (one per latent) for latents (..., d) of shape
    ``z`` (blamed when 1-D: most likely a batch without its latent dimension)."""
    if len(values) not in (1, 2):
        raise ValueError(f"{name} must be (n_v,) or (d, n_v), got shape {tuple(values)}")
    if len(values) == 1 or values[0] == d:
        return
    if z is not None and len(z) == 1:
        g = values[0]
        raise ValueError(
            f"z must be (..., d) with d = {g}, the number of per-latent codebooks in {name} {tuple(values)}; "
            f"got a 1-D z of shape {tuple(z)}, which reads as one sample of {d} latents (n samples of {g} "
            f"latents: shape (n, {g}); one latent per sample: z[:, None] with a (1, n_v) or (n_v,) {name})"
        )
    raise ValueError(
        f"{name} must be (n_v,) or (d, n_v) with d = {d} (the last dimension of the latents), got shape {tuple(values)}"
    )


def compute_dtype(dtypes: Mapping[str, str], convert: str) -> str:
    """The dtype an op computes in, "float32" or "float64", for its floating arguments ``dtypes`` (name -> dtype as
    the front-end prints it, e.g. "torch.float64" or "float64"): float64 when all of them are float64, else float32
    (float16 / bfloat16 are computed in float32 and mix with float32). float64 mixed with any other dtype is a
    ``TypeError`` naming both, with the conversion ``convert`` spells (e.g. "{name}.to({dtype})"): a silent
    promotion would run float32 data in float64 (or the reverse) behind the caller's back."""
    wide = [name for name, dt in dtypes.items() if dt.removeprefix("torch.") == "float64"]
    if not wide:
        return "float32"
    if len(wide) < len(dtypes):
        a, b = wide[0], next(name for name in dtypes if name not in wide)
        raise TypeError(
            f"{a} has dtype {dtypes[a]} but {b} has dtype {dtypes[b]}: convert one to the other's dtype, e.g. "
            f"{convert.format(name=a, dtype=dtypes[b])} or {convert.format(name=b, dtype=dtypes[a])} (float64 mixes "
            f"with no other dtype; half precision mixes with float32)"
        )
    return "float64"


def check_fd_dtype(name: str, dtype: str) -> None:
    """Finite differences need float32 or float64 activations (``dtype``: its name as the front-end prints it, e.g.
    "bfloat16" or "torch.bfloat16")."""
    if dtype.removeprefix("torch.") in HALF_DTYPES:
        raise TypeError(
            f"{name} has dtype {dtype}: finite differences of half-precision activations lose the "
            f"curvature to rounding (errors as large as the value at eps = 0.1); compute them in float32 "
            f"(the Hessian penalties call fn on float32 latents with autocast off: give fn float32 weights)"
        )
