"""The fields of :class:`~refimpl.models.graph_transformer.GraphTransformer` that only some
architectures read, and their checks: a value set where an architecture never reads it would be
ignored without a word, so it is refused in one line."""

from __future__ import annotations

from typing import Any

from refimpl.fields import (
    check_bool,
    check_nonnegative_int,
    check_nonnegative_number,
    check_positive_int,
)
from refimpl.validation import check_input, check_optional_input

__all__ = ["ARCHS", "ARCH_FIELDS", "STUDY_ARCHS", "check_arch_fields", "check_study_pe"]

STUDY_ARCHS = ("gt", "graphit", "san")
ARCHS = ("transformer-conv", *STUDY_ARCHS)
KERNELS = ("random-walk", "diffusion")
NORMS = ("batch", "layer", "layer+batch", "none")
# the fields only some architectures read, with their defaults and who reads them
ARCH_FIELDS = {
    "global_node": (False, ("transformer-conv",)),
    "attn_dropout": (0.0, ("transformer-conv",)),
    "lipschitz_norm": (None, ("transformer-conv",)),
    "ffn_channels": (None, ("transformer-conv", "gt")),  # GraphiT-GT's and SAN's FFN: 2 D
    "norm": (None, STUDY_ARCHS),
    "explicit_bias": (False, ("gt", "graphit")),
    "full_graph": (True, ("graphit", "san")),
    "gamma": (0.1, ("san",)),
    "kernel": ("random-walk", ("graphit",)),
    "kernel_steps": (16, ("graphit",)),
    "kernel_gamma": (0.25, ("graphit",)),
    "kernel_beta": (1.0, ("graphit",)),
    "lpe_eigenpairs": (0, STUDY_ARCHS),
    "lpe_channels": (16, STUDY_ARCHS),
}


def check_arch_fields(model: Any) -> None:
    """Check ``model.arch`` and the fields only some architectures read.

    The architecture is known, the fields it does not read keep their defaults (a value set
    there would be ignored without a word), and the ones it reads are valid; sets ``norm`` to
    ``"batch"`` (the released configurations') where None. One line per problem.

    Parameters
    ----------
    model : GraphTransformer
        The model being constructed (its fields are normalised in place).
    """
    if model.arch not in ARCHS:
        raise ValueError(f"GraphTransformer arch must be one of {ARCHS}, got {model.arch!r}")
    for name in ("explicit_bias", "full_graph"):  # "False" would read as true
        object.__setattr__(
            model, name, check_bool(getattr(model, name), f"GraphTransformer {name}")
        )
    for name, (default, readers) in ARCH_FIELDS.items():
        value = getattr(model, name)
        if model.arch not in readers and not (value is default or value == default):
            raise ValueError(
                f"GraphTransformer {name}={value!r} applies to arch {' or '.join(readers)}, "
                f"not {model.arch!r}"
            )
    if model.arch not in STUDY_ARCHS:
        return
    object.__setattr__(model, "norm", "batch" if model.norm is None else model.norm)
    if model.norm not in NORMS:
        raise ValueError(f"GraphTransformer norm must be one of {NORMS}, got {model.norm!r}")
    if model.kernel not in KERNELS:
        raise ValueError(f"GraphTransformer kernel must be one of {KERNELS}, got {model.kernel!r}")
    check_positive_int(model.kernel_steps, "GraphTransformer kernel_steps")
    for name in ("gamma", "kernel_gamma", "kernel_beta"):
        check_nonnegative_number(getattr(model, name), f"GraphTransformer {name}")
    check_nonnegative_int(model.lpe_eigenpairs, "GraphTransformer lpe_eigenpairs")
    check_positive_int(model.lpe_channels, "GraphTransformer lpe_channels")
    if model.lpe_eigenpairs and model.pe_dim:
        raise ValueError(
            "GraphTransformer takes one positional encoding: pe_dim (Laplacian or random-walk "
            "columns added) or lpe_eigenpairs (SAN's learned encoding), not both"
        )
    if model.lpe_eigenpairs and model.lpe_channels >= model.hidden_channels:
        raise ValueError(
            f"GraphTransformer lpe_channels ({model.lpe_channels}) must be below "
            f"hidden_channels ({model.hidden_channels}): the encoding fills the last "
            "lpe_channels of each node's D"
        )


def check_study_pe(model: Any, pe: Any, n: int, like: Any) -> None:
    """Check that ``pe`` fits the model; one line otherwise.

    Parameters
    ----------
    model : GraphTransformer
        With a study ``arch``.
    pe : array or None
        ``(N, pe_dim)`` columns, or ``(N, m, 3)`` padded eigenpairs with a validity column
        (1.0 valid, 0.0 padding; ``lpe_eigenpairs``), or None.
    n : int
        ``N``, the input's nodes.
    like : array
        The node features, whose dtype and backend ``pe`` must share.
    """
    if not model.lpe_eigenpairs:
        check_optional_input(pe, "pe", "pe_dim", model.pe_dim or None, n, like, "GraphTransformer")
        return
    m = model.lpe_eigenpairs
    if pe is None:
        raise ValueError(
            f"GraphTransformer with lpe_eigenpairs={m} needs pe, the padded eigenpairs (N, {m}, "
            "3) (refimpl.nn.transformer.san_lpe.eigenpairs_padded)"
        )
    check_input(pe, "pe", shape=(n, m, 3))
    if pe.dtype != like.dtype:
        raise TypeError(f"pe has dtype {pe.dtype} but x has {like.dtype}; pass one dtype")
    valid = pe[:, :, 2] > 0.5  # a step function: its gradient is 0 (B2)
    if not bool(valid.any(axis=1).all()):
        raise ValueError(
            "pe[:, :, 2] marks valid eigenpairs (1.0; 0.0 for padding, read as > 0.5): every "
            "node needs at least one (a graph of n nodes has n eigenpairs)"
        )
