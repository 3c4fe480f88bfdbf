"""Tensor-by-tensor comparison of two implementations: the table and verdict that ``refimpl golden
verify`` and ``refimpl crosscheck`` print.

For each named tensor, ``a`` ours and ``b`` the reference (the other implementation,
or the stored golden value):

    max abs error  = max |a - b|
    max rel error  = max |a - b| / scale,   scale = max(max |b|, floor)

Relative errors are taken against the tensor's largest reference entry, not entry by
entry: a gradient entry that is zero by cancellation (a softmax's shift invariance,
say) is rounding on both sides and would otherwise look infinitely wrong. Within a
*group* of tensors (all gradients of one loss) the scale can be the group's largest
entry, for the same reason one level up: a whole tensor can be zero by cancellation
(PyG's ``lin_key.bias``, whose shift the softmax ignores). A tensor passes when its
relative error is at most its ``rtol``; shapes must match exactly, and a tensor missing on
one side fails with a message saying which.

Condition-aware comparison (``magnitudes=``): where the reference can be re-run, the
rounding it carries is measured entry by entry (``refimpl.testing.rounding``), as the
magnitude ``m_j`` of the terms whose rounding made entry ``j``. Each entry is then judged
on its own denominator:

    rel error_j = |a_j - b_j| / max(scale, m_j)

so an entry that is a cancellation among large terms (a bias gradient behind PairNorm's
centring, a gradient through a collapsed normalisation's ``1 / eps``) is held to ``rtol``
of those terms, not of the result. Every denominator is at least ``scale``: magnitudes
only excuse rounding the reference itself shows, never loosen a well-conditioned entry.
The earlier ad hoc fixes are this rule's special cases: the group scale is the
magnitude of a set of gradients summed from common terms, and a dead network (our
gradients exactly 0, autograd's rounding noise) is judged by the noise's own magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refimpl.backend import to_numpy

__all__ = ["Comparison", "TensorComparison", "compare_tensors", "host_array"]


@dataclass(frozen=True)
class TensorComparison:
    r"""One tensor's agreement: a row of :meth:`Comparison.table`.

    Parameters
    ----------
    name : str
        The tensor's name, as in the mappings compared.
    shape : tuple of int
        The reference's shape (``()`` for a scalar, or when the reference lacks it).
    max_abs_error : float
        $\max_j |a_j - b_j|$, ours $a$ against the reference $b$.
    max_rel_error : float
        $\max_j |a_j - b_j| / scale$, entry by entry with magnitudes (module docstring).
    scale : float
        The denominator of the relative error (at the worst entry).
    rtol : float
        The tolerance this tensor was judged by.
    passed : bool
        ``max_rel_error <= rtol`` and no ``problem``.
    problem : str, default ""
        A missing tensor or a shape mismatch, in words; empty when compared.
    """

    name: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    scale: float
    rtol: float
    passed: bool
    problem: str = ""


@dataclass
class Comparison:
    """All tensors of one comparison, each judged by its own tolerance (outputs and gradients
    of one case usually have different ones: ``a + b`` joins two comparisons).

    Parameters
    ----------
    tensors : list of TensorComparison, default empty
        One per tensor, in the order :meth:`table` prints them. The comparison passes when
        it holds at least one and every one passed.
    """

    tensors: list[TensorComparison] = field(default_factory=list)

    def __add__(self, other: Comparison) -> Comparison:
        return Comparison(self.tensors + other.tensors)

    @property
    def passed(self) -> bool:
        return bool(self.tensors) and all(t.passed for t in self.tensors)

    @property
    def max_rel_error(self) -> float:
        return max((t.max_rel_error for t in self.tensors), default=math.nan)

    def table(self, title: str = "") -> str:
        """A fixed-width table, one row per tensor, then the verdict."""
        width = max([len("tensor")] + [len(t.name) for t in self.tensors])
        header = (
            f"{'tensor':<{width}}  {'shape':<14} {'max abs err':>12} {'max rel err':>12} "
            f"{'rtol':>8}  ok"
        )
        rows = [title] if title else []
        rows += [header, "-" * len(header)]
        for t in self.tensors:
            if t.problem:
                rows.append(f"{t.name:<{width}}  {t.problem}")
                continue
            shape = "x".join(str(s) for s in t.shape) or "scalar"
            rows.append(
                f"{t.name:<{width}}  {shape:<14} {t.max_abs_error:>12.3e} "
                f"{t.max_rel_error:>12.3e} {t.rtol:>8.0e}  {'yes' if t.passed else 'NO'}"
            )
        failed = sum(not t.passed for t in self.tensors)
        verdict = (
            f"PASS: all {len(self.tensors)} tensors agree within their rtol"
            if self.passed
            else f"FAIL: {failed} of {len(self.tensors)} tensors disagree beyond their rtol"
        )
        return "\n".join([*rows, verdict])


def compare_tensors(
    ours: Mapping[str, Any],
    reference: Mapping[str, Any],
    rtol: float,
    groups: Mapping[str, list[str]] | None = None,
    magnitudes: Mapping[str, Any] | None = None,
) -> Comparison:
    """Compare ``ours[name]`` with ``reference[name]`` for every name in either mapping.

    Names are reported in the order of ``reference``, then those only ``ours`` has; a name
    on one side only, or a shape mismatch, fails with a ``problem``.

    Parameters
    ----------
    ours : mapping of str to array
        Our tensors by name: NumPy, CuPy or torch (moved to the host as float64).
    reference : mapping of str to array
        The other implementation's (or the stored golden) tensors by name.
    rtol : float
        The tolerance every tensor is judged by.
    groups : mapping of str to list of str, optional
        A group label to the tensor names that share one scale (their largest reference
        entry), e.g. all gradients; other tensors are scaled by themselves.
    magnitudes : mapping of str to array, optional
        Names to arrays shaped like the reference: per entry, the magnitude of the terms
        whose rounding made it (:func:`refimpl.testing.estimate_rounding`), a floor under
        that entry's denominator (module docstring).

    Returns
    -------
    Comparison
        One :class:`TensorComparison` per name; ``.passed`` and ``.table()`` give the
        verdict and the table the CLI prints.
    """
    host = {name: _host(value) for name, value in reference.items()}
    mine = {name: _host(value) for name, value in ours.items()}
    group_scale: dict[str, float] = {}
    for members in (groups or {}).values():
        present = [host[n] for n in members if n in host and host[n].size]
        scale = max((float(np.max(np.abs(b))) for b in present), default=0.0)
        group_scale.update({n: scale for n in members})
    result = Comparison()
    for name in [*host, *(n for n in mine if n not in host)]:
        a, b = mine.get(name), host.get(name)
        if a is None or b is None or a.shape != b.shape:
            if a is None or b is None:
                problem = f"missing in {'ours' if a is None else 'the reference'}"
            else:
                problem = f"shape {a.shape} (ours) vs {b.shape} (reference)"
            shape = () if b is None else b.shape
            result.tensors.append(
                TensorComparison(name, shape, math.inf, math.inf, math.nan, rtol, False, problem)
            )
            continue
        finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
        abs_error = float(np.max(np.abs(a - b), initial=0.0)) if finite else math.inf
        own = float(np.max(np.abs(b), initial=0.0)) if finite else 0.0
        scale = max(group_scale.get(name, own), np.finfo(np.float64).tiny)
        rel_error = abs_error / scale
        if finite and magnitudes is not None and name in magnitudes and b.size:
            magnitude = _host(magnitudes[name])
            if magnitude.shape != b.shape:
                raise ValueError(f"{name}: magnitudes {magnitude.shape} for a tensor of {b.shape}")
            denominators = np.maximum(scale, magnitude)
            relative = np.abs(a - b) / denominators
            worst = int(np.argmax(relative))
            rel_error, scale = float(relative.flat[worst]), float(denominators.flat[worst])
        result.tensors.append(
            TensorComparison(name, b.shape, abs_error, rel_error, scale, rtol, rel_error <= rtol)
        )
    return result


def host_array(value: Any) -> np.ndarray:
    """A NumPy array (a view where it can be) of a NumPy/CuPy array, a torch tensor (detached,
    on the host, without importing torch) or anything ``np.asarray`` takes."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor / Parameter
        value = value.detach().cpu().numpy()
    return to_numpy(value)


def _host(value: Any) -> np.ndarray:
    """A float64 host copy (exact for float32 and float64 input)."""
    return np.asarray(host_array(value), dtype=np.float64)
