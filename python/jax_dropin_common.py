"""What the JAX drop-in examples share (python/jax_dropin_tripod.py, python/jax_dropin_qlae.py).

- :func:`load_authors`: import the authors' ``disentangle`` package and one of their training scripts from a
  checkout of their repository, without installing what those modules import only to load datasets, log, plot or
  debug (TensorFlow Datasets, wandb, hydra, ...): while the package is imported, each such module that is not
  installed is a placeholder that the training step never calls.
- :func:`jax_compat`: the names their 2023-24 code calls that JAX has since removed (``jax.tree_map``), restored
  as aliases of the ``jax.tree_util`` functions.
- :func:`params_filtered`: their optimizers label only the array leaves of the model, which optax >= 0.2 also
  requires of the params given to ``update`` (their step gives the whole model): the params are filtered first.
- :func:`swapped`: patch attributes for the length of a ``with`` block (the drop-in, applied at run time: the
  checkout's files are never edited).
- :func:`compiled`, :func:`run_pair`, :func:`printer`, :func:`report`: the authors' training step compiled twice (the
  original, and traced with the drop-in's patches), trained for a number of steps from one seed, each step's losses
  side by side as it is done; :func:`cli`: the command line of both examples around them.
- :func:`procedural_images`: a small synthetic data set (their data sets come through TensorFlow Datasets).

Nothing of the authors' code is copied here: it is imported from the checkout named on the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import math
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

# imported at the top of the authors' modules and scripts, called only to load data, log, plot or debug
IMPORT_ONLY = (
    "tensorflow",
    "tensorflow_datasets",
    "wandb",
    "ipdb",
    "dm_pix",
    "h5py",
    "sklearn",
    "hydra",
    "omegaconf",
    "seaborn",
    "matplotlib",
    "pandas",
    "tqdm",
)


class _Placeholder(types.ModuleType):
    """A module that is not installed: an attribute, call or item of it is another placeholder, and it may be a
    base class (their dataset modules subclass TensorFlow Datasets builders at import time)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return _Placeholder(f"{self.__name__}()")

    def __getitem__(self, key):
        return _Placeholder(f"{self.__name__}[]")

    def __setitem__(self, key, value) -> None:
        pass

    def __mro_entries__(self, bases):
        return (object,)


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a :class:`_Placeholder` for every module under ``roots`` and records which roots were imported."""

    def __init__(self, roots: set[str]):
        self.roots, self.used = roots, set()

    def find_spec(self, name, path=None, target=None):
        root = name.partition(".")[0]
        if root not in self.roots:
            return None
        self.used.add(root)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module) -> None:
        pass


def _is_package(name: str) -> bool:
    return name == "disentangle" or name.startswith("disentangle.")


def load_authors(checkout: str | Path, scripts: Sequence[str] = ()) -> types.SimpleNamespace:
    """The authors' ``disentangle`` package and ``scripts/<name>.py`` modules, imported from ``checkout``.

    Returns a namespace with ``package`` (the ``disentangle`` module), ``scripts`` (name -> module) and
    ``placeholders`` (the import-only modules that were not installed and stood in as placeholders). Both
    authors' repositories name their package ``disentangle``: afterwards ``sys.modules`` holds whatever it held
    before (the modules returned keep working), so both can be loaded in one process.
    """
    root = Path(checkout).resolve()
    if not (root / "disentangle" / "__init__.py").is_file():
        raise SystemExit(f"{root} is not a checkout of the authors' repository (no disentangle/__init__.py)")
    missing = {m for m in IMPORT_ONLY if importlib.util.find_spec(m) is None}
    finder = _PlaceholderFinder(missing)
    saved = {k: sys.modules.pop(k) for k in [k for k in sys.modules if _is_package(k)]}
    sys.meta_path.append(finder)
    sys.path.insert(0, str(root))
    try:
        package = importlib.import_module("disentangle")
        loaded = {}
        for name in scripts:
            spec = importlib.util.spec_from_file_location(
                f"_authors_{root.name}_{name}", root / "scripts" / f"{name}.py"
            )
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        sys.path.remove(str(root))
        sys.meta_path.remove(finder)
        for k in [k for k, m in sys.modules.items() if isinstance(m, _Placeholder) or _is_package(k)]:
            del sys.modules[k]  # libraries probe sys.modules (einops looks for "tensorflow")
        sys.modules.update(saved)
    return types.SimpleNamespace(package=package, scripts=loaded, placeholders=sorted(finder.used), root=root)


def jax_compat() -> list[str]:
    """Restore ``jax.tree_map`` / ``jax.tree_leaves`` (removed from JAX in 0.6; the authors' code calls them) as
    aliases of their ``jax.tree_util`` versions where missing; returns what was added."""
    added = []
    for name in ("tree_map", "tree_leaves"):
        try:
            getattr(jax, name)
        except AttributeError:
            setattr(jax, name, getattr(jax.tree_util, name))
            added.append(f"jax.{name} = jax.tree_util.{name}")
    return added


class ConfigDict(dict):
    """A hashable dict that JAX treats as one leaf (not a pytree node), as hydra's ``DictConfig`` was in the
    authors' runs: their QLAE model hashes its label tree (``QuantizedAE.partition``), lambdas included."""

    def __hash__(self):
        return hash(tuple(sorted(self.items())))


def params_filtered(optimizer, keep: Callable):
    """``optimizer`` whose ``update`` sees only the leaves of ``params`` that ``keep`` accepts (``equinox.filter``):
    the tree the authors built their ``optax.multi_transform`` labels from."""
    import equinox as eqx
    import optax

    def update(updates, state, params=None):
        return optimizer.update(updates, state, None if params is None else eqx.filter(params, keep))

    return optax.GradientTransformation(optimizer.init, update)


@contextlib.contextmanager
def swapped(patches: Sequence[tuple[object, str, object]]) -> Iterator[None]:
    """``setattr(owner, name, value)`` for each (owner, name, value) inside the block, the originals after it (a
    class's own attribute as stored: a staticmethod stays one; an inherited one is deleted again)."""
    missing = object()
    originals = [(owner, name, vars(owner).get(name, missing)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(originals):
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def in_float64(tree):
    """``tree`` with its floating-point arrays cast to float64 (under ``jax_enable_x64``): the authors' modules
    hard-code float32 in places (input maps), so the models are built in float32 and cast whole."""
    return jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float64) if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating) else x,
        tree,
    )


def quietly(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with its prints swallowed (their optimizer set-up prints the whole label tree)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def procedural_images(key: jax.Array, n: int, size: int, *, low: float = 0.0) -> jax.Array:
    """(n, 3, size, size) images in [low, 1] of a Shapes3D-like scene drawn from 6 independent factors: wall, floor
    and object hue, object size, horizontal and vertical position (a square on a two-coloured background)."""
    f = jax.random.uniform(key, (6, n))
    hue = f[:3, :, None] * 2 * np.pi + jnp.array([0.0, 2.1, 4.2])  # (3 parts, n, 3 channels)
    colour = 0.5 + 0.5 * jnp.cos(hue)
    ys, xs = jnp.meshgrid(jnp.arange(size) / size, jnp.arange(size) / size, indexing="ij")
    half = 0.1 + 0.15 * f[3][:, None, None]
    cy, cx = 0.25 + 0.5 * f[4][:, None, None], 0.25 + 0.5 * f[5][:, None, None]
    inside = (jnp.abs(ys - cy) < half) & (jnp.abs(xs - cx) < half)  # (n, size, size)
    floor = ys >= 0.5
    img = jnp.where(floor[None, :, :, None], colour[1][:, None, None, :], colour[0][:, None, None, :])
    img = jnp.where(inside[..., None], colour[2][:, None, None, :], img)
    return low + (1 - low) * jnp.moveaxis(img, -1, 1)


def compiled(step, *args, patches: Sequence[tuple[object, str, object]] = (), label: str | None = None, **kwargs):
    """``step`` (an ``equinox.filter_jit`` function) traced with ``patches`` applied and compiled ahead of time
    for these arguments; with a ``label``, says what it compiles and how long that took (XLA compiles the authors'
    models for minutes on a 2-core CPU). JAX's caches are cleared first: the authors' loss is itself jitted, and its
    trace for one variant would otherwise be reused by the other (JAX keys its caches on the function, not on the
    module globals a patch replaces)."""
    if label:
        print(f"compiling {label} ...", end=" ", flush=True)
    start = time.perf_counter()
    jax.clear_caches()
    with swapped(patches):
        out = step.lower(*args, **kwargs).compile()
    if label:
        print(f"{time.perf_counter() - start:.0f} s", flush=True)
    return out


def gradient_difference(original, dropin) -> float:
    """|| dropin - original || / || original || over the float leaves of two gradient pytrees."""
    pairs = [
        (x, y)
        for x, y in zip(jax.tree_util.tree_leaves(original), jax.tree_util.tree_leaves(dropin), strict=True)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    diff = sum(float(jnp.sum(jnp.square(y - x))) for x, y in pairs)
    norm = sum(float(jnp.sum(jnp.square(x))) for x, _ in pairs)
    return (diff / max(norm, np.finfo(np.float64).tiny)) ** 0.5


def run_pair(
    original: tuple[Callable, Callable | None],
    dropin: tuple[Callable, Callable | None],
    state,
    batches: Sequence,
    keys: Sequence,
    loss_of: Callable,
    show: Callable[[int, dict], None] | None = None,
) -> dict[str, list]:
    """Train with the original ``(step, grad)`` pair (``step(state, batch, key) -> (state, logs)``,
    ``grad(state, batch, key) -> gradients of the loss``, or None) over ``batches`` / ``keys``; at every step also
    evaluate the drop-in's step (and gradient) at the same state (lockstep: the two losses and gradients of one
    state), and step the drop-in trained on its own from the same start (the independent trajectory). Returns the
    per-step loss dicts (``loss_of(logs)``) "original", "lockstep", "independent" and the "gradient" differences
    (NaN without grad functions); ``show(step, runs)`` is called after each step."""
    out: dict[str, list] = {"original": [], "lockstep": [], "independent": [], "gradient": []}
    current = own = state
    for i, (batch, key) in enumerate(zip(batches, keys, strict=True)):
        after, logs = original[0](current, batch, key)
        _, logs_d = dropin[0](current, batch, key)
        own, logs_i = dropin[0](own, batch, key)
        out["original"].append({k: float(v) for k, v in loss_of(logs).items()})
        out["lockstep"].append({k: float(v) for k, v in loss_of(logs_d).items()})
        out["independent"].append({k: float(v) for k, v in loss_of(logs_i).items()})
        grads = original[1] is not None and dropin[1] is not None
        out["gradient"].append(
            gradient_difference(original[1](current, batch, key), dropin[1](current, batch, key)) if grads else math.nan
        )
        current = after
        if show is not None:
            show(i, out)
    return out


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), np.finfo(np.float32).tiny)


def _columns(names: Sequence[str], gradients: bool) -> list[str]:
    return (
        [f"{names[0]} (orig.)", f"{names[0]} (drop-in)"]
        + [f"d {n}" for n in names]
        + (["d gradient"] if gradients else [])
        + [f"{names[0]} indep.", f"d {names[0]} indep."]
    )


def _row(runs: dict[str, list], i: int, gradients: bool) -> dict[str, float]:
    """Step i of :func:`run_pair`: the two total losses at one state, the relative differences of every loss (and
    of the gradient), the independent trajectory's total loss and its difference."""
    o, s, t = runs["original"][i], runs["lockstep"][i], runs["independent"][i]
    names = list(o)
    row = {f"{names[0]} (orig.)": o[names[0]], f"{names[0]} (drop-in)": s[names[0]]}
    row.update({f"d {n}": relative(o[n], s[n]) for n in names})
    if gradients:
        row["d gradient"] = runs["gradient"][i]
    row[f"{names[0]} indep."] = t[names[0]]
    row[f"d {names[0]} indep."] = relative(o[names[0]], t[names[0]])
    return row


def header(names: Sequence[str], gradients: bool) -> str:
    """The table of :func:`report` / :func:`printer`: what it shows, and its column names."""
    return (
        "per step: the total loss of the original and of the drop-in at the original's state and batch (lockstep), "
        "the relative differences (d) of each loss" + (" and of the gradient" if gradients else "") + ", and the "
        "total loss of the drop-in trained on its own (indep.) with its difference\n"
        + f"{'step':>4} "
        + " ".join(f"{c:>15}" for c in _columns(names, gradients))
    )


def _line(i: int, row: dict[str, float]) -> str:
    return f"{i:>4} " + " ".join(f"{v:>15.8g}" if not k.startswith("d ") else f"{v:>15.3e}" for k, v in row.items())


def printer(every: int = 1, last: int | None = None) -> Callable[[int, dict], None]:
    """A ``show`` for :func:`run_pair`: the header before step 0, then every ``every``-th step's row (and the
    ``last``), printed as it is computed."""

    def show(i: int, runs: dict[str, list]) -> None:
        gradients = not math.isnan(runs["gradient"][i])
        if i == 0:
            print(header(list(runs["original"][0]), gradients), flush=True)
        if i % every == 0 or i == last:
            print(_line(i, _row(runs, i, gradients)), flush=True)

    return show


def worst(runs: dict[str, list]) -> dict[str, float]:
    """The largest relative difference of each kind over the steps of :func:`run_pair`."""
    gradients = not math.isnan(runs["gradient"][0])
    out: dict[str, float] = {}
    for i in range(len(runs["original"])):
        for k, v in _row(runs, i, gradients).items():
            if k.startswith("d "):
                out[k] = max(out.get(k, 0.0), v)
    return out


def report(runs: dict[str, list], *, every: int = 1) -> dict[str, float]:
    """Print the steps of :func:`run_pair` (every ``every``-th and the last) after the run; returns :func:`worst`."""
    show = printer(every, last=len(runs["original"]) - 1)
    for i in range(len(runs["original"])):
        show(i, runs)
    return worst(runs)


def cli(doc: str, *, repo: str, batch: int, seed: int, setup: Callable, argv=None) -> int:
    """The command line of a drop-in example: parse the arguments, ``setup(checkout, size=, batch=, steps=, seed=,
    x64=, gradients=)`` (a namespace with ``authors``, ``compat``, ``swapped`` (a callable giving the text of what
    was swapped), ``original``, ``dropin``, ``state``, ``batches``, ``keys``, ``losses``, ``traced``,
    ``image_size``), train, printing each step as it is done. Exit status 1 when the drop-in was never traced or a
    lockstep difference exceeds ``--rtol``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkout", help=f"a checkout of {repo}")
    p.add_argument(
        "--steps",
        type=int,
        default=10,
        help="training steps (default 10: a few minutes on 2 cores, much of them XLA compiling the authors' step "
        "twice; docs/jax.md records the agreement over 100)",
    )
    p.add_argument("--batch", type=int, default=batch, help=f"batch size (the paper's: {batch})")
    p.add_argument("--size", choices=("small", "paper"), default="small")
    p.add_argument("--seed", type=int, default=seed, help="their configs' experiment.seed")
    p.add_argument("--every", type=int, default=1, help="print every N-th step")
    p.add_argument(
        "--gradients",
        action="store_true",
        help="also compare the two gradients at every step (compiles the "
        "authors' loss gradient twice more: about twice the start-up time)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="exit 1 when a lockstep loss or gradient differs by more (relative; default 1e-9 with --x64, else 1e-2: "
        "in float32 Tripod's penalty rounds apart by up to 2e-3 over 100 steps, its gradient by up to 9e-3)",
    )
    p.add_argument("--x64", action="store_true", help="train in float64 (jax_enable_x64)")
    a = p.parse_args(argv)
    if a.x64:
        jax.config.update("jax_enable_x64", True)
    print(
        f"{a.steps} steps of the authors' train_step, batch {a.batch}, {a.size} model, "
        f"{'float64' if a.x64 else 'float32'}: the original and with qkernels.jax dropped in",
        flush=True,
    )
    run = setup(a.checkout, size=a.size, batch=a.batch, steps=a.steps, seed=a.seed, x64=a.x64, gradients=a.gradients)
    print(
        f"authors' code: {run.authors.root} (placeholders for the uninstalled import-only modules: "
        f"{', '.join(run.authors.placeholders) or 'none'}; {'; '.join(run.compat) or 'no JAX aliases needed'})"
    )
    print(f"swapped: {run.swapped()}")
    print(f"images {run.image_size} x {run.image_size}; training", flush=True)
    runs = run_pair(
        run.original, run.dropin, run.state, run.batches, run.keys, run.losses, show=printer(a.every, last=a.steps - 1)
    )
    most = worst(runs)
    print("max over the steps: " + ", ".join(f"{k} {v:.3e}" for k, v in most.items()))
    if not all(run.traced.values()):
        print("the drop-in was not traced: the runs compared the original with itself")
        return 1
    rtol = a.rtol if a.rtol is not None else 1e-9 if a.x64 else 1e-2
    return 0 if max(v for k, v in most.items() if "indep." not in k) <= rtol else 1
