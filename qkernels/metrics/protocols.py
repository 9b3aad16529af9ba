"""Evaluation protocols: each paper's own way of scoring a representation, in one table.

A protocol fixes which metrics run, on how many samples, with which estimator settings, and whether a
discrete model is scored on its integer codes or on its latent values. :func:`qkernels.metrics.evaluate`
takes one by name (``protocol="tripod"``); ``qkernels train`` scores each method with its authors'
protocol (:data:`METHOD_PROTOCOL`) and records the name in ``metrics.json``.

=============  =========  ===============================================  =================================
protocol       samples    InfoMEC                                          DCI
=============  =========  ===============================================  =================================
``qlae``       10,000     k = 10, InfoE ``class_weight="balanced"``,        random forest (100, entropy), 90/10
                          ``max_iter=100``; inactive: range 0 (discrete),   train/test, depth tuned on the
                          range < max / 20 (continuous)                     held-out 10%, whose accuracy is I
                                                                            (``preset="qlae"``)
``tripod``     10,000     k = 10, balanced, ``max_iter=100``; inactive:     random forest (100, entropy, depth
                          IQR <= 0.1 (discrete, on the VALUES), IQR <=      10), 90/10 split
                          max IQR / 10 (continuous)                         (``preset="tripod"``)
``factorqvae`` 10,000     k = 3 (scikit-learn's default: their code passes  gradient boosting (scikit-learn's
               (+5,000    none), balanced, ``max_iter=500``; inactive as    defaults), 10,000 train + 5,000
               for DCI)   ``qlae``; discrete models scored on codes         test (``preset="dlib"``)
``dlib``       10,000     (not reported)                                   as ``factorqvae``; MIG with 20 bins
               (+5,000)                                                     on 10,000
``fast``       2,000      the library's defaults                           random forest (``preset="tripod"``)
=============  =========  ===============================================  =================================

Every paper protocol (``qlae``, ``tripod``, ``factorqvae``) fits InfoE as its authors' code does (scikit-learn's
``LogisticRegression`` stopped at ``max_iter`` on the unscaled design: ``infoe_fit="sklearn"``) and keeps their 0/0
(``degenerate="nan"``: an all-zero NMI column makes InfoM NaN); ``fast`` and a bare :func:`~qkernels.metrics.infomec`
use the converged fit and the finite conventions. ``selection``: how a run's checkpoint is chosen for the table
(:mod:`qkernels.train.selection`): ``"final"``, or ``"tripod"``, the Tripod paper's (its experiments section and
App. B.1: discard the checkpoints under the dataset's PSNR threshold, report the one with the best InfoM).

Sources: QLAE: latent_quantization ``disentangle/metrics/infomec.py`` and ``configs/train_ae.yaml``
(``num_val_data: 10000``), the QLAE paper's App. C.5 (DCI). Tripod: ``disentangle/metrics/infomec.py``,
``disentangle/metrics/dci.py``, ``configs/train_autoencoder.yaml`` (``num_val: 10000``),
``scripts/train_autoencoder.py`` (FSQ values with ``discrete_latents=True``). FactorQVAE:
``metrics/infomec.py`` (``mutual_info_classif`` without ``n_neighbors``, ``max_iter=500``),
``metrics/dci.py`` (``num_train`` 10000, ``num_test`` 5000), ``metrics/utils.py`` (discrete models
scored on indices). dlib: disentanglement_lib's defaults (Locatello et al., 2019), which D-VAE and
Cliff follow. ``fast`` is no paper's: the CPU demo's quick score.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LATENT_KINDS = ("codes", "values")
# the authors' InfoE fit and 0/0 (latent_quantization, tripod, FactorQVAE disentangle/metrics/infomec.py)
AUTHORS_INFOMEC = {"infoe_fit": "sklearn", "degenerate": "nan"}


@dataclass(frozen=True)
class Protocol:
    """One paper's evaluation. ``samples[m]``: metric m runs on the first ``samples[m]`` rows of one draw
    of factors (the largest count is drawn and encoded once); ``options[m]``: its keyword arguments;
    ``discrete_latents``: a discrete model's representation, ``"codes"`` (integer indices) or ``"values"``
    (its latent values, scored as discrete). ``source``: where the settings come from. ``selection``: the
    checkpoint a run reports (:data:`qkernels.train.selection.SELECTIONS`: ``"final"`` or ``"tripod"``).

    Examples:
        >>> from qkernels.metrics import Protocol
        >>> p = Protocol("mine", ("mig", "sap"), {"mig": 500, "sap": 300}, {"mig": {"num_bins": 10}})
        >>> p.num_samples()  # the largest count is drawn once
        500
    """

    name: str
    metrics: tuple[str, ...]
    samples: dict[str, int]
    options: dict[str, dict] = field(default_factory=dict)
    discrete_latents: str = "codes"
    source: str = ""
    selection: str = "final"

    def num_samples(self) -> int:
        return max(self.samples[m] for m in self.metrics)


PROTOCOLS: dict[str, Protocol] = {
    "qlae": Protocol(
        "qlae",
        ("infomec", "dci"),
        {"infomec": 10_000, "dci": 10_000},
        {
            "infomec": {
                "k": 10,
                "prune": "range",
                "prune_threshold": 1 / 20,
                "class_weight": "balanced",
                "max_iter": 100,
                **AUTHORS_INFOMEC,
            },
            "dci": {"preset": "qlae"},
        },
        "codes",
        "latent_quantization disentangle/metrics/infomec.py; QLAE paper App. C.5",
    ),
    "tripod": Protocol(
        "tripod",
        ("infomec", "dci"),
        {"infomec": 10_000, "dci": 10_000},
        {
            "infomec": {"k": 10, "prune": "iqr", "class_weight": "balanced", "max_iter": 100, **AUTHORS_INFOMEC},
            "dci": {"preset": "tripod"},
        },
        "values",
        "tripod disentangle/metrics/infomec.py, dci.py; configs/train_autoencoder.yaml; the paper's "
        "checkpoint selection (experiments section; App. B.1, Table 2)",
        selection="tripod",
    ),
    "factorqvae": Protocol(
        "factorqvae",
        ("infomec", "dci"),
        {"infomec": 10_000, "dci": 15_000},
        {
            "infomec": {
                "k": 3,
                "prune": "range",
                "prune_threshold": 1 / 20,
                "class_weight": "balanced",
                "max_iter": 500,
                **AUTHORS_INFOMEC,
            },
            "dci": {"preset": "dlib"},
        },
        "codes",
        "FactorQVAE metrics/infomec.py, metrics/dci.py, metrics/utils.py",
    ),
    "dlib": Protocol(
        "dlib",
        ("dci", "mig"),
        {"dci": 15_000, "mig": 10_000, "infomec": 10_000},
        {"dci": {"preset": "dlib"}, "mig": {"num_bins": 20}},
        "codes",
        "disentanglement_lib defaults (Locatello et al., 2019)",
    ),
    "fast": Protocol(
        "fast",
        ("infomec", "dci"),
        {"infomec": 2_000, "dci": 2_000, "mig": 2_000},
        {"dci": {"preset": "tripod"}},
        "codes",
        "qkernels' CPU demo",
    ),
}

#: each method's authors' protocol (``qkernels train`` default)
METHOD_PROTOCOL: dict[str, str] = {
    "ae": "qlae",
    "qlae": "qlae",
    "tripod": "tripod",
    "qvae": "factorqvae",
    "factorqvae": "factorqvae",
    "dvae": "dlib",
    "factordvae": "dlib",
    "beta_vae": "dlib",
    "beta_tcvae": "dlib",
    "factorvae": "dlib",
    "cliff_vae": "dlib",
    "cliff_ae": "dlib",
}


def get_protocol(protocol: str | Protocol) -> Protocol:
    """The protocol named ``protocol`` (or ``protocol`` itself).

    Raises:
        ValueError: an unknown name (known: the keys of ``PROTOCOLS``).

    Examples:
        >>> from qkernels.metrics import get_protocol
        >>> p = get_protocol("tripod")
        >>> p.metrics, p.options["dci"], p.discrete_latents
        (('infomec', 'dci'), {'preset': 'tripod'}, 'values')
        >>> get_protocol(p) is p
        True
    """
    if isinstance(protocol, Protocol):
        return protocol
    if not isinstance(protocol, str) or protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {sorted(PROTOCOLS)}, got {protocol!r}")
    return PROTOCOLS[protocol]
