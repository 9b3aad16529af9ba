"""The papers' own numbers, for ``qkernels sweep --published``: each value copied from the paper's table, with the
table and where it stands in the project's copy of the paper (``shared/papers/<file>.txt``, line of the table's
caption or title; the stored text has no page numbers).

:data:`PUBLISHED` maps (paper, method, dataset) to ``{"source": ..., "spread": ..., "values": {metric key: value or
(value, spread)}}`` on the paper's own scale (:data:`qkernels.train.table.TABLES` gives the scale of each column).
Only the methods qkernels trains are listed, on the datasets the papers report. The D-VAE paper's tables lost their
numbers in the stored text, so none are listed for it.
"""

from __future__ import annotations

_QLAE_COLS = (
    "infomec.infom",
    "infomec.infoe",
    "infomec.infoc",
    "dci.disentanglement",
    "dci.informativeness",
    "dci.completeness",
    "recon.psnr",
)
_QLAE_FILE = "qlae-latent-quantization-neurips2023.txt"
# QLAE, App. E, Tables 12-15 ("Intervals denote 95% confidence intervals of the mean"): InfoM, InfoE, InfoC, D, I,
# C, PSNR (dB), each (mean, half-width)
_QLAE = {
    ("ae", "shapes3d", 12, 616): (
        (0.41, 0.03),
        (0.98, 0.01),
        (0.28, 0.01),
        (0.11, 0.02),
        (0.82, 0.01),
        (0.08, 0.02),
        (37.3, 0.1),
    ),
    ("qlae", "shapes3d", 12, 616): (
        (0.95, 0.02),
        (0.99, 0.01),
        (0.55, 0.02),
        (0.81, 0.01),
        (0.99, 0.01),
        (0.61, 0.01),
        (32.9, 0.2),
    ),
    ("ae", "mpi3d", 13, 632): (
        (0.37, 0.04),
        (0.72, 0.03),
        (0.36, 0.03),
        (0.15, 0.02),
        (0.83, 0.02),
        (0.14, 0.02),
        (36.2, 0.2),
    ),
    ("qlae", "mpi3d", 13, 632): (
        (0.61, 0.04),
        (0.63, 0.05),
        (0.51, 0.03),
        (0.36, 0.04),
        (0.85, 0.04),
        (0.36, 0.05),
        (37.2, 0.6),
    ),
    ("ae", "falcor3d", 14, 648): (
        (0.39, 0.03),
        (0.74, 0.03),
        (0.20, 0.03),
        (0.08, 0.02),
        (0.76, 0.02),
        (0.07, 0.01),
        (29.9, 0.1),
    ),
    ("qlae", "falcor3d", 14, 648): (
        (0.71, 0.03),
        (0.77, 0.02),
        (0.44, 0.02),
        (0.50, 0.03),
        (0.96, 0.03),
        (0.38, 0.02),
        (29.4, 0.4),
    ),
    ("ae", "isaac3d", 15, 664): (
        (0.42, 0.04),
        (0.80, 0.02),
        (0.21, 0.05),
        (0.13, 0.02),
        (0.85, 0.02),
        (0.10, 0.02),
        (38.4, 0.1),
    ),
    ("qlae", "isaac3d", 15, 664): (
        (0.78, 0.03),
        (0.97, 0.03),
        (0.49, 0.03),
        (0.69, 0.02),
        (0.99, 0.01),
        (0.54, 0.02),
        (40.4, 0.3),
    ),
}
# Tripod, Table 1 (means only): (InfoM, InfoC, InfoE), (D, C, I) per dataset
_TRIPOD = {
    "shapes3d": ((0.94, 0.59, 1.00), (0.80, 0.65, 1.00)),
    "mpi3d": ((0.64, 0.53, 0.84), (0.54, 0.48, 0.86)),
    "falcor3d": ((0.72, 0.56, 0.82), (0.49, 0.47, 0.88)),
    "isaac3d": ((0.84, 0.68, 0.95), (0.72, 0.67, 0.99)),
}
# FactorQVAE, Table 1 (one number each): D, I, C, InfoM, InfoE, InfoC, MSE x 1e4 ("OVAE" in the stored text is QVAE)
_FQ_COLS = (
    "dci.disentanglement",
    "dci.informativeness",
    "dci.completeness",
    "infomec.infom",
    "infomec.infoe",
    "infomec.infoc",
    "recon.mse",
)
_FQ = {
    ("qvae", "shapes3d"): (0.73, 0.94, 0.54, 0.69, 0.93, 0.38, 0.8),
    ("factorqvae", "shapes3d"): (0.86, 0.97, 0.65, 0.84, 0.89, 0.52, 0.6),
    ("qvae", "isaac3d"): (0.56, 0.81, 0.49, 0.51, 0.72, 0.34, 0.4),
    ("factorqvae", "isaac3d"): (0.59, 0.75, 0.56, 0.68, 0.64, 0.45, 0.7),
    ("qvae", "mpi3d"): (0.34, 0.61, 0.31, 0.31, 0.77, 0.27, 0.9),
    ("factorqvae", "mpi3d"): (0.46, 0.67, 0.44, 0.33, 0.94, 0.36, 1.1),
}


def _build() -> dict[tuple[str, str, str], dict]:
    out: dict[tuple[str, str, str], dict] = {}
    for (method, dataset, table, line), vals in _QLAE.items():
        out["qlae", method, dataset] = {
            "source": f"QLAE paper, App. E, Table {table} ({_QLAE_FILE}:{line})",
            "spread": "95% CI",
            "values": dict(zip(_QLAE_COLS, vals, strict=True)),
        }
    for dataset, (infomec, dci) in _TRIPOD.items():
        keys = (
            "infomec.infom",
            "infomec.infoc",
            "infomec.infoe",
            "dci.disentanglement",
            "dci.completeness",
            "dci.informativeness",
        )
        out["tripod", "tripod", dataset] = {
            "source": "Tripod paper, Table 1 (tripod-three-inductive-biases-icml2024.txt:221)",
            "spread": "none",
            "values": dict(zip(keys, (*infomec, *dci), strict=True)),
        }
    for (method, dataset), vals in _FQ.items():
        out["factorqvae", method, dataset] = {
            "source": "FactorQVAE paper, Table 1 (factorqvae-factor-quantized-vae.txt:325)",
            "spread": "none",
            "values": dict(zip(_FQ_COLS, vals, strict=True)),
        }
    cliff = "cliff-quantized-disentanglement-icml2025.txt"
    out["cliff", "cliff_vae", "shapes3d"] = {
        "source": f"Cliff paper, App. F, Table 3 ({cliff}:409)",
        "spread": "standard error",
        "values": {
            "dci.disentanglement": (80.33, 2.60),
            "dci.completeness": (68.52, 1.52),
            "dci.informativeness": (99.26, 0.30),
            "mig.mig": (28.54, 2.45),
        },
    }
    out["cliff", "cliff_vae", "balls"] = {
        "source": f"Cliff paper, App. E, Table 2 ({cliff}:392); their Balls model is an autoencoder + Cliff "
        "(App. F.3), not qkernels' cliff_vae",
        "spread": "standard error",
        "values": {"mcc.spearman": (52.06, 4.00)},
    }
    return out


#: (paper, method, dataset) -> {"source", "spread", "values"}: the module docstring
PUBLISHED: dict[tuple[str, str, str], dict] = _build()


def published(paper: str, method: str, dataset: str) -> dict | None:
    """The paper's numbers for ``method`` on ``dataset`` (a procedural stand-in: its real dataset's), or None.

    Examples:
        >>> from qkernels.train.published import published
        >>> p = published("tripod", "tripod", "shapes3d_procedural")
        >>> p["values"]["infomec.infom"], p["source"].split(" (")[0]
        (0.94, 'Tripod paper, Table 1')
        >>> published("qlae", "qlae", "mpi3d")["values"]["recon.psnr"]
        (37.2, 0.6)
    """
    from qkernels.models.registry import STAND_INS

    return PUBLISHED.get((paper, method, STAND_INS.get(dataset, dataset)))
