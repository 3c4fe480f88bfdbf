"""PairNorm and LayerNorm written in torch from the equations: references for autograd.

Imported only by modules that have already skipped themselves without torch.
"""

from __future__ import annotations

import torch

from refimpl.nn.norms.layernorm import LayerNorm
from refimpl.nn.norms.pairnorm import PairNorm


def torch_pairnorm(norm: PairNorm, x: object) -> object:
    """PairNorm from the equations (the authors' code, with eps placement as configured).

    The root of a sum of squares is taken as a norm, whose autograd derivative at 0 is 0
    (``sqrt``'s is infinite and would give NaN); ``n`` below counts the nodes averaged.
    """

    def scaled(base: object, dim: int | None) -> object:
        n = 1 if dim is not None else base.shape[0]
        if norm.inside:
            q = base.pow(2).sum(dim=dim, keepdim=True) / n
            return norm.scale * base / (q + norm.eps).sqrt()
        root = torch.linalg.vector_norm(base, dim=dim, keepdim=True) / n**0.5
        return norm.scale * base / (root + norm.eps)

    mean = x.mean(dim=0, keepdim=True)
    if norm.mode == "PN-SCS":
        return scaled(x, dim=1) - mean
    return scaled(x - mean, dim=None if norm.mode == "PN" else 1)


def torch_layernorm(norm: LayerNorm, params: dict, x: object) -> object:
    """LayerNorm from the equations, either eps placement (a norm for the root, as above)."""
    dims = (1,) if norm.mode == "node" else (0, 1)
    size = x.shape[1] if norm.mode == "node" else x.numel()
    centred = x - x.mean(dim=dims, keepdim=True)
    if norm.inside:
        out = centred / (centred.pow(2).mean(dim=dims, keepdim=True) + norm.eps).sqrt()
    else:
        root = torch.linalg.vector_norm(centred, dim=dims, keepdim=True) / size**0.5
        out = centred / (root + norm.eps)
    return out * params["weight"] + params["bias"] if norm.affine else out
