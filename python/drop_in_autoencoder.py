"""Dropping qkernels into a plain PyTorch autoencoder loop: each regularizer / quantizer is a 2-3 line change,
marked ``# qkernels:`` below. Runs a few hundred steps on procedural sprites (CPU, a minute or two).
The default run uses QLAE's quantizer (per-latent learnable codebooks, straight-through).

    python python/drop_in_autoencoder.py                                            # QLAE's quantizer
    python python/drop_in_autoencoder.py --quantizer fsq --klm 1e-4 --nhp 1e-2     # Tripod's three legs
    python python/drop_in_autoencoder.py --quantizer none --cliff 1.0               # Cliff on the latents
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from qkernels.data import load_dataset
from qkernels.nn.quantize import FSQ, LatentQuantizer


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quantizer", choices=("none", "latent", "fsq"), default="latent")
    p.add_argument("--cliff", type=float, default=0.0, help="weight of the Cliff loss on the latents")
    p.add_argument("--klm", type=float, default=0.0, help="weight of Tripod's KLM")
    p.add_argument("--nhp", type=float, default=0.0, help="weight of Tripod's normalized Hessian penalty")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    ds = load_dataset("sprites", image_size=32)
    d = 10
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(32 * 32, 256), nn.GELU(), nn.Linear(256, d))
    # GELU, not ReLU: the normalized Hessian penalty's finite differences need a smooth function
    decoder = nn.Sequential(nn.Linear(d, 256), nn.GELU(), nn.Linear(256, 32 * 32), nn.Unflatten(1, (1, 32, 32)))
    # qkernels: a quantizer is a module between encoder and decoder
    quantizer = {"none": None, "latent": LatentQuantizer(d, 10), "fsq": FSQ(12)}[a.quantizer]
    params = [*encoder.parameters(), *decoder.parameters(), *(quantizer.parameters() if quantizer else [])]
    opt = torch.optim.Adam(params, lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(a.steps):
        x = ds.observations_from_factors(ds.sample_factors(64, g))
        z = encoder(x)
        loss_extra = torch.zeros(())
        if quantizer is not None:  # qkernels: quantize (straight-through) and add its auxiliary losses
            q = quantizer(z)
            z_cont, z = z, q.z_q
            loss_extra = loss_extra + 0.01 * (q.loss_quantize + q.loss_commit)
        loss = F.binary_cross_entropy_with_logits(decoder(z), x)
        if a.cliff:  # qkernels: Cliff loss on the latents
            from qkernels.ops.kde import cliff_loss

            loss_extra = loss_extra + a.cliff * cliff_loss(z)
        if a.klm or a.nhp:  # qkernels: Tripod's KLM / NHP; scales from the continuous latents
            from qkernels.ops.hessian import normalized_hessian_penalty
            from qkernels.ops.kde import klm_loss

            std = torch.tanh(z_cont if quantizer is not None else z).std(0, unbiased=False) + 1e-6
            if a.klm:
                loss_extra = loss_extra + a.klm * klm_loss(z, std=std)
            if a.nhp:
                loss_extra = loss_extra + a.nhp * normalized_hessian_penalty(lambda u: decoder[:2](u), z, std)
        opt.zero_grad()
        (loss + loss_extra).backward()
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step}: recon {loss.item():.4f} extra {loss_extra.item():.4f}")


if __name__ == "__main__":
    main()
