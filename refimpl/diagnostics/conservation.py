"""Training diagnostics of GAT-balance: the conservation residual, balancedness, parameter change.

Per hidden neuron ``i`` of layer ``l`` (``l = 0 .. L-2``; the paper's
``1 .. L-1``), with the incoming, attention and outgoing parameter sets of
:mod:`refimpl.neurons`:

- the conservation residual of Thm 2.2 (Eq. 3; Eq. 7's ``delta``)
  ``delta_i = <in_i, grad in_i> - <a_i, grad a_i> - <out_i, grad out_i>``,
  zero for every positively homogeneous activation;
- the balancedness of Cor 2.3 (Eq. 5)
  ``c_i = ||in_i||^2 - ||a_i||^2 - ||out_i||^2``, constant under gradient flow
  and zero after :func:`refimpl.init.balance`; its sum over ``i`` is the layer
  law of Cor 2.4 (Eq. 6);
- relative gradient norms ``||grad W^l||_F / ||W^l||_F`` per layer (Fig. 3b,
  4b, 5, 12) and the relative change ``|w* - w0| / |w*|`` of each parameter
  (Fig. 3a, 4a, 8, 11).

All functions take parameter dicts keyed as ``GAT.param_shapes`` and work on
either backend; results are host floats and NumPy arrays.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import get_array_module, to_numpy
from refimpl.neurons import layer_structure, neuron_sums

__all__ = [
    "ConservationResidual",
    "balancedness",
    "balancedness_summary",
    "conservation_residuals",
    "fraction_changed",
    "grad_norms",
    "parameter_changes",
    "relative_grad_norms",
]


class ConservationResidual(NamedTuple):
    """Thm 2.2's three inner products per hidden neuron of one layer, all ``(n_l,)``."""

    incoming: np.ndarray  # <in_i, grad in_i>
    attention: np.ndarray  # <a_i, grad a_i>
    outgoing: np.ndarray  # <out_i, grad out_i>

    @property
    def delta(self) -> np.ndarray:
        """Eq. 7: ``incoming - attention - outgoing``; zero when the law holds."""
        return self.incoming - self.attention - self.outgoing

    @property
    def scale(self) -> np.ndarray:
        """The largest of the three magnitudes, per neuron."""
        return np.maximum(
            np.maximum(np.abs(self.incoming), np.abs(self.attention)), np.abs(self.outgoing)
        )

    @property
    def relative(self) -> np.ndarray:
        """``|delta| / scale`` per neuron (0 where all three vanish: a neuron with no gradient)."""
        scale = self.scale
        return np.abs(self.delta) / np.where(scale > 0, scale, 1.0)


def conservation_residuals(
    params: dict[str, Any], grads: dict[str, Any]
) -> list[ConservationResidual]:
    """GAT-balance Thm 2.2 (Eq. 3), Thm 6.3 and 6.4 for every hidden layer, layer 0 first."""
    layers = layer_structure(params)
    products = {name: value * grads[name] for name, value in params.items()}
    return [
        ConservationResidual(*(to_numpy(s) for s in neuron_sums(products, layers, i)))
        for i in range(len(layers) - 1)
    ]


def balancedness(params: dict[str, Any]) -> list[np.ndarray]:
    """Cor 2.3 (Eq. 5): ``c = ||in||^2 - ||a||^2 - ||out||^2`` per hidden neuron, per layer."""
    layers = layer_structure(params)
    squares = {name: value * value for name, value in params.items()}
    sums = (neuron_sums(squares, layers, i) for i in range(len(layers) - 1))
    return [to_numpy(incoming - attention - outgoing) for incoming, attention, outgoing in sums]


def balancedness_summary(params: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per hidden layer: the layer sum of ``c`` (Cor 2.4) and its spread over neurons."""
    return {
        f"layer{i}": {
            "sum": float(c.sum()),
            "min": float(c.min()),
            "max": float(c.max()),
            "mean_abs": float(np.abs(c).mean()),
        }
        for i, c in enumerate(balancedness(params))
    }


def _kind(name: str) -> tuple[str, str | None]:
    """``(layer, "feature" | "attention" | None)``: feature matrices, attention vectors, or
    neither (biases)."""
    layer, local = name.split(".", 1) if "." in name else ("model", name)
    # By prefix, so any model's W* matrices and att* vectors count, not only a GAT's.
    if local.startswith("att"):
        return layer, "attention"
    if local.startswith(("W", "res_W")):
        return layer, "feature"
    return layer, None


def _squared_norms(params: dict[str, Any], grads: dict[str, Any]) -> dict[str, dict[str, list]]:
    """``{layer: {kind: [||grad||^2, ||param||^2]}}`` over the feature and attention tensors."""
    squares: dict[str, dict[str, list[float]]] = {}
    for name, value in params.items():
        layer, kind = _kind(name)
        if kind is None:
            continue
        xp = get_array_module(value)
        entry = squares.setdefault(layer, {}).setdefault(kind, [0.0, 0.0])
        entry[0] += float(xp.sum(grads[name] * grads[name]))
        entry[1] += float(xp.sum(value * value))
    return squares


def grad_norms(params: dict[str, Any], grads: dict[str, Any]) -> dict[str, dict]:
    """Per layer, ``||grad||_F`` of the feature weights and of the attention vectors.

    The quantity of LipschitzNorm Fig. 2 (attention, per layer and epoch). Same
    grouping and return layout as :func:`relative_grad_norms`.
    """
    return {
        layer: {kind: math.sqrt(g) for kind, (g, _) in kinds.items()}
        for layer, kinds in _squared_norms(params, grads).items()
    }


def relative_grad_norms(params: dict[str, Any], grads: dict[str, Any]) -> dict[str, dict]:
    """Per layer, ``||grad||_F / ||param||_F`` for feature weights and attention vectors.

    Feature parameters are the ``W*`` and ``res_W`` matrices, attention the
    ``att*`` vectors (biases are left out). Returns ``{layer: {"feature": r,
    "attention": r}}`` with ``None`` where the parameters are all zero (a
    relative norm is undefined there: zero-initialised attention, say).
    """
    return {
        layer: {
            kind: (math.sqrt(g) / math.sqrt(p) if p > 0 else None) for kind, (g, p) in kinds.items()
        }
        for layer, kinds in _squared_norms(params, grads).items()
    }


def parameter_changes(
    initial: dict[str, Any], final: dict[str, Any], min_magnitude: float = 1e-4
) -> dict[str, dict[str, np.ndarray]]:
    """Per layer and kind, the change of each parameter (GAT-balance Sec. 2 and App. 7).

    Feature weights: the relative change ``|w* - w0| / |w*|`` of those with
    ``|w*| >= min_magnitude`` (the paper's "significant" parameters). Attention:
    the same, except for a layer whose attention started at zero (every
    balanced scheme), where the absolute change ``|a* - a0|`` is used, as the
    paper does. Returns ``{layer: {"feature": values, "attention": values}}``.
    """
    grouped: dict[str, dict[str, list[np.ndarray]]] = {}
    for name, start in initial.items():
        layer, kind = _kind(name)
        if kind is None:
            continue
        grouped.setdefault(layer, {}).setdefault(kind, []).append(
            np.stack([to_numpy(start).ravel(), to_numpy(final[name]).ravel()])
        )
    changes: dict[str, dict[str, np.ndarray]] = {}
    for layer, kinds in grouped.items():
        for kind, pieces in kinds.items():
            w0, w1 = np.concatenate(pieces, axis=1)  # (P,) each
            if kind == "attention" and not np.any(w0):
                values = np.abs(w1 - w0)
            else:
                kept = np.abs(w1) >= min_magnitude
                values = np.abs(w1[kept] - w0[kept]) / np.abs(w1[kept])
            changes.setdefault(layer, {})[kind] = values
    return changes


def fraction_changed(
    initial: dict[str, Any], final: dict[str, Any], threshold: float, min_magnitude: float = 1e-4
) -> dict[str, dict[str, float | None]]:
    """Per layer and kind, the fraction of :func:`parameter_changes` above ``threshold``
    (Fig. 3a: 0.05, Fig. 4a: 0.5; ``threshold=0`` with ``>`` counts any change, Fig. 8's
    complement). ``None`` where no parameter qualifies."""
    return {
        layer: {
            kind: (float(np.mean(values > threshold)) if values.size else None)
            for kind, values in kinds.items()
        }
        for layer, kinds in parameter_changes(initial, final, min_magnitude).items()
    }
