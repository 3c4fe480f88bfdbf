"""The result of a gradient check: one :class:`TensorError` per tensor, gathered in a
:class:`GradCheckReport` (what :func:`refimpl.testing.check_gradients` returns)."""

from __future__ import annotations

from dataclasses import dataclass, field

from refimpl.testing.tolerances import GRADCHECK_RTOL

__all__ = ["GradCheckReport", "TensorError"]


@dataclass(frozen=True)
class TensorError:
    r"""Finite-difference comparison for one tensor (the rule of :func:`judge_gradient`).

    Parameters
    ----------
    name : str
        The tensor: ``"input[0]"``, ``"param:W"``, ...
    max_abs_error : float
        $\max |analytic - numeric|$ over the checked entries.
    max_rel_error : float
        ``max_abs_error / scale``, the number judged against ``rtol``.
    scale : float
        Denominator of the relative error (largest entry, or the resolution's floor).
    num_checked : int
        Entries compared.
    size : int
        Entries in the tensor.
    """

    name: str
    max_abs_error: float
    max_rel_error: float
    scale: float
    num_checked: int
    size: int


@dataclass
class GradCheckReport:
    """Per-tensor errors of one gradient check; ``passed`` is the verdict at ``rtol``.

    Parameters
    ----------
    errors : list of TensorError, default empty
        One per checked tensor, inputs first.
    eps : float, default 1e-6
        The central-difference step used.
    rtol : float, default ``GRADCHECK_RTOL`` (1e-6)
        The tolerance the check was run for.
    resolution : float, default 0.0
        The floor the errors were judged with: the predicted resolution, or the measured
        noise where that is larger (:mod:`refimpl.testing.gradcheck`).
    """

    errors: list[TensorError] = field(default_factory=list)
    eps: float = 1e-6
    rtol: float = GRADCHECK_RTOL
    resolution: float = 0.0

    @property
    def max_rel_error(self) -> float:
        return max((e.max_rel_error for e in self.errors), default=0.0)

    @property
    def passed(self) -> bool:
        """Every tensor's relative error at most ``rtol`` (see :func:`judge_gradient`)."""
        return self.max_rel_error <= self.rtol

    def by_name(self) -> dict[str, TensorError]:
        return {e.name: e for e in self.errors}

    def table(self) -> str:
        """A fixed-width table, one row per tensor."""
        header = f"{'tensor':<16} {'checked':>11} {'max abs err':>12} {'max rel err':>12}"
        rows = [header, "-" * len(header)]
        for e in self.errors:
            rows.append(
                f"{e.name:<16} {f'{e.num_checked}/{e.size}':>11} "
                f"{e.max_abs_error:>12.2e} {e.max_rel_error:>12.2e}"
            )
        return "\n".join(rows)
