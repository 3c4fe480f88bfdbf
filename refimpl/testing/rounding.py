"""How much rounding a torch reference computation carries, entry by entry (Monte Carlo arithmetic).

Comparing our results with another implementation's (torch autograd, say) needs a
tolerance that rounding cannot exceed while a wrong derivative does. Rounding is not
proportional to the result: an entry computed as a sum of terms that cancel carries
the rounding of the *terms*. Behind PairNorm's centring, the gradient of a bias added
to every node is ``sum_i d_z_i = 0`` exactly, but computed as ``~u sum_i |d_z_i|``;
behind a collapsed layer (all rows equal) the ``d_z_i`` carry PairNorm's ``1 / eps``,
so the rounding exceeds any tolerance relative to the final gradients (a 4-layer GAT
v1 gave ``2^-25`` against autograd's exact 0, against gradients of order 1). A fixed
``rtol`` times the largest gradient fails such a correct backward; widening ``rtol``
would let wrong ones through everywhere else.

:func:`estimate_rounding` measures instead of modelling. It runs the reference under
a torch dispatch mode that gives the floating-point result of every operation, in the
forward and in autograd's backward alike, a random relative error ``v r``, with ``r``
uniform in ``[-1, 1]``: one rounding per operation, drawn at random (Monte Carlo
arithmetic, Parker 1997; CESTAC, Vignes 1993). A real rounding is at most ``u``, half
an ulp, which cannot be added to a float in its own precision (the sum rounds back);
so the errors are drawn at the virtual precision ``v = 2^8 u`` (Parker's "virtual
precision"; ``1 + v r`` still has 2^8 steps), large enough to be represented and to
drown the runs' own rounding,
small enough to stay in the linear regime, and the spread is scaled back by ``v``.
Over ``samples`` runs with independent draws, each entry ``b_j`` gets

    magnitude_j = max_k |b_j^(k) - b_j| / v

the size of the terms whose rounding made it: ``|b_j|`` for a well-conditioned
entry, ``sum_i |d_z_i|`` for the cancelling sum above, the ``1 / eps``-scaled terms
behind a collapsed normalisation. ``compare_tensors(..., magnitudes=...)`` then
judges ``|ours_j - b_j|`` against ``rtol * max(scale, magnitude_j)``: the same
``rtol`` as before, applied to the magnitude of the summands instead of the result's.

Why this stays a test that fails: a wrong derivative is wrong at the rounding-free
level. A slip of ``delta`` relative in an entry exceeds the tolerance unless
``delta |b_j| < rtol magnitude_j``, which needs the entry to be cancellation by
``delta / rtol`` (a million-fold for a 1e-4 slip at ``rtol = 1e-10``): only entries
that are themselves rounding escape, and there no comparison can say anything.

Limits, honestly: the perturbation rounds each operation's *result* once, not the
partial sums inside a reduction; a reduction's inputs are perturbed, which covers
the cancellation among its terms (the dominant error) but not its own summation
order, a factor of order ``log n`` at most. Operations that select or copy values
(maxima, gathers, concatenation, copies, constants) are left exact: they do not round,
and a maximum's backward finds its argument by comparing the result with the inputs, so
a perturbed maximum would lose its gradient altogether. Operations that return views or
act in place (``expand``, ``add_``) are left exact too, since a new tensor would break
their aliasing. A perturbed result near a branch (a ReLU's kink, a maximum's tie) can take
the other branch; the magnitude then measures that jump, which is right: such an
entry depends on rounding and cannot be judged finer. Our side's rounding is assumed
to be of the same order as the reference's (the same function, other summation
orders); ``rtol / u`` (about 4.5e5 in float64 at ``rtol = 1e-10``) is the headroom.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import to_numpy

__all__ = ["RoundingEstimate", "estimate_rounding"]

_VIRTUAL_FACTOR = 2**8  # v / u: the perturbation's size in units of a real rounding

# aten operations whose results are input values or constants, not roundings (module docstring)
_EXACT = frozenset(
    {
        "_to_copy", "abs", "amax", "amin", "arange", "cat", "clamp", "clamp_max", "clamp_min",
        "clone", "constant_pad_nd", "copy", "cummax", "cummin", "empty", "empty_like", "fill",
        "flip", "fmax", "fmin", "full", "full_like", "gather", "index", "index_select",
        "kthvalue", "lift_fresh", "lift_fresh_copy", "masked_fill", "masked_select", "max",
        "maximum", "median", "min", "minimum", "neg", "new_empty", "new_full", "new_ones",
        "new_zeros", "ones", "ones_like", "relu", "repeat", "roll", "scatter", "sign", "sort",
        "stack", "take", "topk", "where", "zeros", "zeros_like",
    }
)  # fmt: skip
_SELECTING_REDUCTIONS = ("amax", "amin")  # scatter_reduce's exact reductions


class RoundingEstimate(NamedTuple):
    r"""A reference's values and, per entry, the magnitude of the terms whose rounding made it.

    Attributes
    ----------
    values : dict of str to numpy.ndarray
        The unperturbed run's results, float64 host copies.
    magnitudes : dict of str to numpy.ndarray
        Same names and shapes: $\max_k |b^{(k)} - b| / v$ per entry (module docstring).
    """

    values: dict[str, np.ndarray]
    magnitudes: dict[str, np.ndarray]


def estimate_rounding(
    compute: Callable[[], Mapping[str, Any]], *, samples: int = 4, seed: int = 0
) -> RoundingEstimate:
    """Run ``compute`` once as is and ``samples`` times with every torch operation re-rounded.

    Parameters
    ----------
    compute
        Builds the reference from scratch (leaf tensors, forward, backward) and returns
        named results: torch tensors or arrays. It must be deterministic apart from its
        rounding: random draws are passed in, not made inside.
    samples : int
        Perturbed runs; the maximum over them is the estimate (four make a chance
        underestimate by the ``rtol / u`` headroom impossible in practice). ``0`` gives
        the plain run's values with zero magnitudes.
    seed : int
        Seeds the perturbations, so an estimate (and a test built on it) repeats exactly.

    Returns
    -------
    RoundingEstimate
        ``values`` from the plain run; ``magnitudes`` per entry as in the module
        docstring, ``inf`` where a perturbed run gave a non-finite value for a finite
        one (that entry cannot be judged by rounding).
    """
    import torch  # a testing tool for torch references: torch is not a dependency

    values = _host(compute())
    spread = {name: np.zeros(value.shape) for name, value in values.items()}
    generator = torch.Generator().manual_seed(seed)
    for _ in range(samples):
        with _rerounding(generator):
            perturbed = _host(compute())
        if perturbed.keys() != values.keys():
            raise ValueError(
                f"compute returned {sorted(perturbed)} when perturbed, {sorted(values)} when not"
            )
        for name, value in perturbed.items():
            exact = values[name].astype(np.float64)
            with np.errstate(invalid="ignore"):
                moved = np.abs(value.astype(np.float64) - exact)
            moved[~np.isfinite(moved) & np.isfinite(exact)] = np.inf
            spread[name] = np.fmax(spread[name], moved)
    return RoundingEstimate(
        {name: value.astype(np.float64) for name, value in values.items()},
        {
            name: spread[name] / _virtual_roundoff(float(np.finfo(value.dtype).eps))
            for name, value in values.items()
        },
    )


def _virtual_roundoff(machine_eps: float) -> float:
    """``v = 2^8 u`` for a dtype of machine epsilon ``2 u`` (2^-52 in float64; module docstring)."""
    return _VIRTUAL_FACTOR * machine_eps / 2


def _host(results: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Host arrays of ``compute``'s results, in their own float dtype (it sets ``u``)."""
    host = {}
    for name, value in results.items():
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        array = np.asarray(to_numpy(value))
        if array.dtype.kind != "f":
            raise TypeError(f"{name}: rounding is estimated for float results, got {array.dtype}")
        host[name] = array
    return host


def _rerounding(generator: Any) -> Any:
    """A torch dispatch mode giving each floating-point operation result one random rounding."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def reround(result: Any) -> Any:
        if not (isinstance(result, torch.Tensor) and result.is_floating_point()):
            return result
        v = _virtual_roundoff(torch.finfo(result.dtype).eps)
        r = 2 * torch.rand(result.shape, generator=generator, dtype=result.dtype) - 1
        return result * (1 + v * r)  # a factor, not an addend: infinities stay infinite

    class Rerounding(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            if _is_exact(func, args, kwargs):
                return result
            if isinstance(result, (tuple, list)):
                return type(result)(reround(item) for item in result)
            return reround(result)

    return Rerounding()


def _is_exact(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether an aten operation is left unperturbed: views, in-place, selections, copies."""
    # views and in-place results alias their inputs: a new tensor would break that
    if any(r.alias_info is not None for r in func._schema.returns):
        return True
    name = func.overloadpacket.__name__
    if name == "scatter_reduce":  # (self, dim, index, src, reduce, ...)
        reduce = kwargs.get("reduce", args[4] if len(args) > 4 else None)
        return reduce in _SELECTING_REDUCTIONS
    return name in _EXACT
