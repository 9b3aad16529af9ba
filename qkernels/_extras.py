"""Optional dependencies: ``pip install qkernels`` brings torch and numpy, what the ops need; the rest comes with
extras (pyproject.toml ``[project.optional-dependencies]``): ``metrics`` (scipy, scikit-learn), ``data`` (h5py,
pillow: the file datasets and contact sheets), ``train`` (both: ``qkernels train`` evaluates and draws figures),
``plot`` (matplotlib: ``qkernels bench --plot``), ``docs``, ``jax``, ``dev`` (everything, and the tools).

A feature that needs one imports it inside :func:`needs`, which turns the missing module into one line naming the
feature, the distribution and the extra to install::

    with needs("qkernels.metrics.dci", "metrics"):
        from sklearn.ensemble import RandomForestClassifier
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# import name -> the distribution that provides it
DISTRIBUTIONS = {
    "sklearn": "scikit-learn",
    "scipy": "scipy",
    "h5py": "h5py",
    "PIL": "pillow",
    "matplotlib": "matplotlib",
    "jax": "jax",
    "jaxlib": "jaxlib",
    "ray": "ray",
    "tomli": "tomli",
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency of a feature is not installed; the message names the extra that installs it."""


@contextlib.contextmanager
def needs(feature: str, extra: str) -> Iterator[None]:
    """Imports inside this block that fail for a missing optional dependency (:data:`DISTRIBUTIONS`) raise
    :class:`MissingExtraError`: "``feature`` needs ``distribution``: pip install 'qkernels[``extra``]'". Any other
    ImportError passes unchanged.

    Examples:
        >>> import sys
        >>> saved = sys.modules.get("h5py")
        >>> sys.modules["h5py"] = None  # as if h5py were not installed
        >>> with needs("qkernels.data.Shapes3D", "data"):
        ...     import h5py
        Traceback (most recent call last):
            ...
        qkernels._extras.MissingExtraError: qkernels.data.Shapes3D needs h5py: pip install 'qkernels[data]'
        >>> _ = sys.modules.pop("h5py") if saved is None else sys.modules.update(h5py=saved)
    """
    try:
        yield
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top not in DISTRIBUTIONS:
            raise
        raise MissingExtraError(
            f"{feature} needs {DISTRIBUTIONS[top]}: pip install 'qkernels[{extra}]'", name=err.name
        ) from None


@contextlib.contextmanager
def optional() -> Iterator[None]:
    """Imports inside this block of an optional dependency (:data:`DISTRIBUTIONS`) that is not installed are
    skipped (the rest of the block too), leaving their names undefined: for a module whose functions call
    :func:`require` before they use those names, so that the module itself imports without the extra. Any other
    ImportError passes unchanged.

    Examples:
        >>> import sys
        >>> saved = sys.modules.get("h5py")
        >>> sys.modules["h5py"] = None  # as if h5py were not installed
        >>> with optional():
        ...     import h5py
        >>> "h5py" in dir()
        False
        >>> _ = sys.modules.pop("h5py") if saved is None else sys.modules.update(h5py=saved)
    """
    try:
        yield
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in DISTRIBUTIONS:
            raise


def require(feature: str, extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` (as :func:`needs` words it) for the first of ``modules`` (import names of
    :data:`DISTRIBUTIONS`) that is not installed, without importing any: a command checks before minutes of work
    that the end of it can run.

    Examples:
        >>> require("qkernels train", "train", "numpy")  # installed: nothing happens
        >>> require("a feature", "jax", "no_such_module_xyz")
        Traceback (most recent call last):
            ...
        qkernels._extras.MissingExtraError: a feature needs no_such_module_xyz: pip install 'qkernels[jax]'
    """
    import importlib.util

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a module without a spec
            found = False
        if not found:
            dist = DISTRIBUTIONS.get(name, name)
            raise MissingExtraError(f"{feature} needs {dist}: pip install 'qkernels[{extra}]'", name=name)
