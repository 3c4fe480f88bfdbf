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
    r"""Thm 2.2's three inner products per hidden neuron of one layer, all ``(n_l,)``.

    Attributes
    ----------
    incoming : numpy.ndarray
        $\langle in_i, \nabla in_i \rangle$, the incoming feature weights of neuron $i$
        against their gradient, shape $(n_l,)$.
    attention : numpy.ndarray
        $\langle a_i, \nabla a_i \rangle$, its attention parameters, shape $(n_l,)$.
    outgoing : numpy.ndarray
        $\langle out_i, \nabla out_i \rangle$, its outgoing feature weights (the next
        layer's), shape $(n_l,)$.
    """

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
    """GAT-balance Thm 2.2 (Eq. 3), Thm 6.3 and 6.4 for every hidden layer, layer 0 first.

    Parameters
    ----------
    params : dict of str to array
        The model's parameters, keyed as ``GAT.param_shapes`` (NumPy or CuPy arrays).
    grads : dict of str to array
        The gradient of the loss for each of ``params``, same keys and shapes.

    Returns
    -------
    list of ConservationResidual
        One per hidden layer ($L - 1$ of them), each holding three ``(n_l,)`` host arrays;
        :attr:`ConservationResidual.delta` is zero where the law holds.
    """
    layers = layer_structure(params)
    products = {name: value * grads[name] for name, value in params.items()}
    return [
        ConservationResidual(*(to_numpy(s) for s in neuron_sums(products, layers, i)))
        for i in range(len(layers) - 1)
    ]


def balancedness(params: dict[str, Any]) -> list[np.ndarray]:
    r"""Cor 2.3 (Eq. 5): $c = \|in\|^2 - \|a\|^2 - \|out\|^2$ per hidden neuron, per layer.

    Parameters
    ----------
    params : dict of str to array
        The model's parameters, keyed as ``GAT.param_shapes`` (NumPy or CuPy arrays).

    Returns
    -------
    list of numpy.ndarray
        $c$ for each hidden layer, layer 0 first, each of shape $(n_l,)$; all zero after
        :func:`refimpl.init.balance`.
    """
    layers = layer_structure(params)
    squares = {name: value * value for name, value in params.items()}
    sums = (neuron_sums(squares, layers, i) for i in range(len(layers) - 1))
    return [to_numpy(incoming - attention - outgoing) for incoming, attention, outgoing in sums]


def balancedness_summary(params: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per hidden layer: the layer sum of $c$ (Cor 2.4) and its spread over neurons.

    Parameters
    ----------
    params : dict of str to array
        The model's parameters, keyed as ``GAT.param_shapes`` (NumPy or CuPy arrays).

    Returns
    -------
    dict of str to dict
        ``{"layer0": {"sum", "min", "max", "mean_abs"}, ...}``: per hidden layer, the sum of
        :func:`balancedness` over its neurons (constant under gradient flow, Cor 2.4), its
        smallest and largest value and its mean magnitude, as floats.
    """
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
    r"""Per layer, $\|\nabla W\|_F$ of the feature weights and of the attention vectors.

    The quantity of LipschitzNorm Fig. 2 (attention, per layer and epoch). Same
    grouping as :func:`relative_grad_norms`.

    Parameters
    ----------
    params : dict of str to array
        The model's parameters; names decide the kind (``W*``, ``res_W*``: feature; ``att*``:
        attention; anything else, biases, left out).
    grads : dict of str to array
        The gradient of the loss for each of ``params``, same keys and shapes.

    Returns
    -------
    dict of str to dict
        ``{layer: {"feature": norm, "attention": norm}}`` as floats; a layer lacking a kind
        lacks its key.
    """
    return {
        layer: {kind: math.sqrt(g) for kind, (g, _) in kinds.items()}
        for layer, kinds in _squared_norms(params, grads).items()
    }


def relative_grad_norms(params: dict[str, Any], grads: dict[str, Any]) -> dict[str, dict]:
    r"""Per layer, $\|\nabla W\|_F / \|W\|_F$ for feature weights and attention vectors.

    GAT-balance Fig. 3b, 4b, 5 and 12. Feature parameters are the ``W*`` and ``res_W``
    matrices, attention the ``att*`` vectors (biases are left out).

    Parameters
    ----------
    params : dict of str to array
        The model's parameters, keyed as ``GAT.param_shapes`` or a layer's ``param_shapes``
        (a name without a ``layer.`` prefix counts as layer ``"model"``).
    grads : dict of str to array
        The gradient of the loss for each of ``params``, same keys and shapes.

    Returns
    -------
    dict of str to dict
        ``{layer: {"feature": r, "attention": r}}`` as floats, with ``None`` where the
        parameters are all zero (a relative norm is undefined there: zero-initialised
        attention, say).
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
    r"""Per layer and kind, the change of each parameter (GAT-balance Sec. 2 and App. 7).

    Feature weights: the relative change $|w^* - w_0| / |w^*|$ of those with
    $|w^*| \ge$ ``min_magnitude`` (the paper's "significant" parameters). Attention:
    the same, except for a layer whose attention started at zero (every
    balanced scheme), where the absolute change $|a^* - a_0|$ is used, as the
    paper does.

    Parameters
    ----------
    initial : dict of str to array
        The parameters before training ($w_0$), keyed as ``GAT.param_shapes``.
    final : dict of str to array
        The parameters after training ($w^*$), same keys and shapes.
    min_magnitude : float, default 1e-4
        A parameter whose final magnitude is below it is left out of the relative change
        (it would divide by almost zero). Not applied to the absolute change.

    Returns
    -------
    dict of str to dict
        ``{layer: {"feature": values, "attention": values}}``, each a 1-D NumPy array of
        one change per kept parameter.
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
    """Per layer and kind, the fraction of :func:`parameter_changes` above ``threshold``.

    GAT-balance Fig. 3a (threshold 0.05), Fig. 4a (0.5) and Fig. 8 (0: any change, the
    complement of the figure's share of unchanged parameters).

    Parameters
    ----------
    initial : dict of str to array
        The parameters before training, keyed as ``GAT.param_shapes``.
    final : dict of str to array
        The parameters after training, same keys and shapes.
    threshold : float
        A change strictly above it counts (``>``), so ``0`` counts any change.
    min_magnitude : float, default 1e-4
        Passed to :func:`parameter_changes`: smaller final parameters are left out of the
        relative change.

    Returns
    -------
    dict of str to dict
        ``{layer: {"feature": f, "attention": f}}``, each a float in $[0, 1]$, or ``None``
        where no parameter qualifies.
    """
    return {
        layer: {
            kind: (float(np.mean(values > threshold)) if values.size else None)
            for kind, values in kinds.items()
        }
        for layer, kinds in parameter_changes(initial, final, min_magnitude).items()
    }
