"""Initialisation schemes, and GAT-balance's balancing (Procedure 2.6).

A scheme is ``fn(model, rng) -> {name: host float64 array}``, keyed and ordered
as ``model.param_shapes()``; ``model.init_params(rng, init=NAME)`` moves the
result to the backend and dtype. Every scheme leaves biases and residual
weights (``res_W``) at zero, so that a balanced network stays balanced.

Base schemes (each feature matrix ``W`` of shape ``(out, in)`` drawn on its own,
layer by layer in ``param_shapes`` order; ``W_s`` and ``W_t`` independently):

- ``xavier``: Glorot uniform for ``W`` and attention, as PyG draws them
- ``xavier_normal``: Glorot normal, ``std = sqrt(2 / (fan_in + fan_out))``
- ``xavier_zero_att``: Glorot normal ``W``, attention zero (the paper's Xav_Z)
- ``orthogonal``: every ``W`` (semi-)orthogonal, attention zero
- ``ll_orthogonal``: looks-linear orthogonal: first ``[U; -U]``, hidden ``[[U, -U], [-U, U]]``,
  last ``[V, -V]``; attention zero
- ``identity``: hidden ``W = I``; first and last Glorot normal; attention zero
- ``ll_identity``: hidden ``[[I, -I], [-I, I]]``; first, last Glorot normal; attention zero

Named combinations of GAT-balance Table 1 (and its appendix, Fig. 9):
``Xav`` (= ``xavier_normal``, as the authors' experiments draw it), ``Xav_Z``,
``Bal_X`` (``xavier_normal`` balanced, ``beta = 2``), ``Bal_O`` (``ll_orthogonal``
balanced, ``beta = 2``), ``Bal_LLidentity`` (``beta = 2``) and ``Bal_identity``
(``beta = 1``: identity rows have norm 1).

Attention fans: PyG applies Glorot to its ``(1, H, C)`` attention tensor with
``fan_in + fan_out = H + C``; so do we, for both the uniform and the normal
draw. (``torch.nn.init.xavier_normal_`` on that 3-D tensor would use
``H*C + C``; GAT-balance Sec. 2 states ``E a[i]^2 = 2 / (1 + n)``, i.e. ``H + C``.)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from refimpl.backend import get_array_module
from refimpl.draws import glorot_normal, orthogonal
from refimpl.fields import check_nonnegative_number
from refimpl.neurons import (
    ATTENTION_NAMES,
    WEIGHT_NAMES,
    incoming_sums,
    layer_structure,
    outgoing_sums,
)
from refimpl.neurons import scale_incoming as _scale_incoming
from refimpl.neurons import scale_outgoing as _scale_outgoing

__all__ = [
    "INITIALISERS",
    "balance",
    "init_identity",
    "init_ll_identity",
    "init_ll_orthogonal",
    "init_orthogonal",
    "init_xavier",
    "init_xavier_normal",
    "init_xavier_zero_att",
    "orthogonal",
]

Scheme = Callable[[Any, np.random.Generator], dict[str, np.ndarray]]


# -- looks-linear and identity weights -------------------------------------------------
def _half(n: int, what: str, layer: int) -> int:
    if n % 2:
        raise ValueError(
            f"looks-linear initialisation mirrors neurons in pairs, so widths must be even; "
            f"layer{layer} has {n} {what}. Use an even hidden_channels * heads"
        )
    return n // 2


def _ll_orthogonal_weight(
    rng: np.random.Generator, shape: tuple[int, int], layer: int, num_layers: int
) -> np.ndarray:
    """GAT-balance Sec. 2 "Balanced Orthogonal Initialization": the mirrored block structure."""
    rows, cols = shape
    if num_layers == 1:  # no hidden neuron to mirror
        return orthogonal(rng, shape)
    if layer == 0:  # W^1 = [U; -U], U (n_1/2, n_0)
        u = orthogonal(rng, (_half(rows, "output neurons", layer), cols))
        return np.vstack([u, -u])
    if layer == num_layers - 1:  # W^L = [V, -V], V (n_L, n_{L-1}/2)
        v = orthogonal(rng, (rows, _half(cols, "input features", layer)))
        return np.hstack([v, -v])
    u = orthogonal(  # W^l = [[U, -U], [-U, U]], U (n_l/2, n_{l-1}/2)
        rng, (_half(rows, "output neurons", layer), _half(cols, "input features", layer))
    )
    return np.block([[u, -u], [-u, u]])


def _identity_weight(
    rng: np.random.Generator,
    shape: tuple[int, int],
    layer: int,
    num_layers: int,
    looks_linear: bool,
) -> np.ndarray:
    """Hidden layers ``I`` or ``[[I, -I], [-I, I]]`` (rectangular ``eye`` if not square);
    first and last Glorot normal, as GAT-balance App. 8 (following Eliasof et al.)."""
    rows, cols = shape
    if layer in (0, num_layers - 1):
        return glorot_normal(rng, shape)
    if not looks_linear:
        return np.eye(rows, cols)
    eye = np.eye(_half(rows, "output neurons", layer), _half(cols, "input features", layer))
    return np.block([[eye, -eye], [-eye, eye]])


def _check_looks_linear(model: Any) -> None:
    """Mirrored rows must stay in one output vector: with averaged hidden heads they fall
    into other heads, and for an even head count the average cancels to zero."""
    hidden_heads = [conv.heads for conv in model.layers[:-1]]
    if not getattr(model, "concat", True) and any(h > 1 for h in hidden_heads):
        raise ValueError(
            "looks-linear initialisation mirrors neurons across the rows of a layer; with "
            "averaged hidden heads (concat=False) the mirrored rows land in other heads and "
            "cancel in the average. Use concat=True or one head per hidden layer"
        )


def _layerwise(
    model: Any,
    rng: np.random.Generator,
    weight: Callable[[np.random.Generator, tuple[int, int], int, int], np.ndarray],
    attention: bool,
) -> dict[str, np.ndarray]:
    """Draw every feature matrix with ``weight(rng, shape, layer, L)`` and attention with
    Glorot normal (or zero), in ``param_shapes`` order; biases and ``res_W`` zero."""
    params = {}
    for name, shape in model.param_shapes().items():
        layer, local = name.split(".", 1)
        index = int(layer.removeprefix("layer"))
        if local in WEIGHT_NAMES:
            params[name] = weight(rng, shape, index, model.num_layers)
        elif local in ATTENTION_NAMES and attention:
            params[name] = glorot_normal(rng, shape)
        else:
            params[name] = np.zeros(shape)
    return params


# -- base schemes ------------------------------------------------------------------------
def init_xavier(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each layer's ``GATConv.init_params`` (Glorot uniform, PyG-style); zero bias and res_W.

    Draw order: layer 0's weights and attention in ``GATConv.param_shapes``
    order, then layer 1's, ...; zeros draw nothing. So this equals calling
    ``conv.init_params(rng)`` for each of ``model.layers`` in turn.

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise: its ``param_shapes()`` gives the names and shapes,
        ``model.layers`` the convolutions that draw.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    drawn = {}
    for i, conv in enumerate(model.layers):
        for name, value in conv.init_params(rng, backend="numpy").items():
            drawn[f"layer{i}.{name}"] = value
    # Whatever the layers do not own (the residual weights) starts at zero.
    return {name: drawn.get(name, np.zeros(shape)) for name, shape in model.param_shapes().items()}


def init_xavier_normal(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Glorot normal for every ``W`` and attention (the paper's Xav, from its code's xavierN).

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise: its ``param_shapes()`` gives the names and shapes.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    return _layerwise(model, rng, lambda g, shape, *_: glorot_normal(g, shape), attention=True)


def init_xavier_zero_att(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Glorot normal ``W``, zero attention: GAT-balance Table 1's Xav_Z (the ablation).

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise: its ``param_shapes()`` gives the names and shapes.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    return _layerwise(model, rng, lambda g, shape, *_: glorot_normal(g, shape), attention=False)


def init_orthogonal(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every ``W`` a random (semi-)orthogonal matrix (:func:`orthogonal`); zero attention.

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise: its ``param_shapes()`` gives the names and shapes.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    return _layerwise(model, rng, lambda g, shape, *_: orthogonal(g, shape), attention=False)


def init_ll_orthogonal(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Looks-linear orthogonal (GAT-balance Sec. 2; Burkholz & Dubatovka 2019); zero attention.

    Hidden layers are then balanced by construction (rows and columns of
    ``[[U, -U], [-U, U]]`` have squared norm 2, shared weights); ``Bal_O``
    balances the first and last layer to match. Odd widths raise ``ValueError``, as do
    averaged hidden heads (``concat=False`` with more than one head), where the mirrored rows
    would cancel.

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise (even hidden widths): ``param_shapes()`` names and shapes.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    _check_looks_linear(model)
    return _layerwise(model, rng, _ll_orthogonal_weight, attention=False)


def init_identity(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Identity hidden layers, Glorot-normal first and last layer; zero attention.

    A non-square hidden layer gets the rectangular ``eye``, as GAT-balance App. 8.

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise: its ``param_shapes()`` gives the names and shapes.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    return _layerwise(model, rng, partial(_identity_weight, looks_linear=False), attention=False)


def init_ll_identity(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Looks-linear identity hidden layers ``[[I, -I], [-I, I]]``; zero attention.

    First and last layer Glorot normal. Odd hidden widths raise ``ValueError``, as do averaged
    hidden heads (``concat=False`` with more than one head).

    Parameters
    ----------
    model : refimpl.models.GAT
        The model to initialise (even hidden widths): ``param_shapes()`` names and shapes.
    rng : numpy.random.Generator
        The generator every random entry is drawn from, in ``param_shapes`` order.

    Returns
    -------
    dict of str to numpy.ndarray
        One float64 host array per parameter, keyed and ordered as ``model.param_shapes()``.
    """
    _check_looks_linear(model)
    return _layerwise(model, rng, partial(_identity_weight, looks_linear=True), attention=False)


# -- balancing ---------------------------------------------------------------------------
def balance(params: dict[str, Any], beta: float = 2.0, order: str = "forward") -> dict[str, Any]:
    """GAT-balance Procedure 2.6: rescale so that every hidden neuron has ``c = 0`` (Eq. 5).

    ``c_i = ||in_i||^2 - ||a_i||^2 - ||out_i||^2`` with the incoming, attention
    and outgoing sets of :mod:`refimpl.neurons` (all heads of the neuron,
    ``W_s`` and ``W_t`` rows when not shared, bias and residual rows):

    1. attention, biases and residual weights are set to zero;
    2. ``order="forward"``: each first-layer neuron's incoming rows are scaled
       to squared norm ``beta``; then, for ``l = 1 .. L-1``, the columns leaving
       neuron ``i`` of layer ``l`` are scaled to the squared norm of its
       (already final) incoming rows;
    3. ``order="reverse"`` (Remark 2.7): the columns of the last layer are scaled
       to squared norm ``beta`` per input neuron; then, from layer ``L-1`` down to
       1, each neuron's incoming rows are scaled to its outgoing squared norm.

    Directions are kept, only norms change. Joint rows (``W_s`` and ``W_t``, or
    several heads averaged into one neuron) are scaled by one common factor (Thm 6.3:
    both are incoming weights of the neuron); the released GAT-balance code instead
    zeroes ``W_t`` for unshared GATv2 and balances ``W_s`` alone, so a port of it
    agrees with this only where ``W_t`` starts at zero. A
    single-layer network has no hidden neuron: its rows are scaled to ``beta``.

    Parameters
    ----------
    params : dict of str to array
        A GAT model's parameters (``layer0.W``, ``layer0.att_src``, ...), any backend; kept.
    beta : float, default 2.0
        The squared norm the first layer's incoming rows (``order="forward"``) or the last
        layer's columns (``"reverse"``) are scaled to; positive and finite.
    order : {"forward", "reverse"}, default "forward"
        Which end the balancing starts from (step 2 or step 3 above).

    Returns
    -------
    dict of str to array
        A new dict of the same keys on the same backend, every hidden neuron at ``c = 0``.

    Raises
    ------
    ValueError
        If ``order`` is unknown, ``beta`` not positive, or a neuron to rescale has zero weights.
    """
    if order not in ("forward", "reverse"):
        raise ValueError(f"order must be 'forward' or 'reverse', got {order!r}")
    # refuses a bool (True balanced to 1) and an int beyond float range (10**400) too
    check_nonnegative_number(beta, "balance beta (a squared norm)", allow_zero=False)
    layers = layer_structure(params)
    out = dict(params)
    for layer in layers:  # step 1
        for key in (*layer.attention, layer.bias, layer.residual):
            if key is not None:
                out[key] = params[key] * 0
    last = len(layers) - 1
    if order == "forward" or last == 0:
        have = incoming_sums(_squares(out), layers, 0)
        out = _scale_incoming(out, layers, 0, _ratio(beta, have, "incoming", 0), attention=False)
        for layer_index in range(last):
            target = incoming_sums(_squares(out), layers, layer_index)
            have = outgoing_sums(_squares(out), layers, layer_index)
            out = _scale_outgoing(
                out, layers, layer_index, _ratio(target, have, "outgoing", layer_index)
            )
    else:
        have = outgoing_sums(_squares(out), layers, last - 1)
        out = _scale_outgoing(out, layers, last - 1, _ratio(beta, have, "outgoing", last - 1))
        for layer_index in range(last - 1, -1, -1):
            target = outgoing_sums(_squares(out), layers, layer_index)
            have = incoming_sums(_squares(out), layers, layer_index)
            out = _scale_incoming(
                out, layers, layer_index, _ratio(target, have, "incoming", layer_index), False
            )
    return out


def _squares(params: dict[str, Any]) -> dict[str, Any]:
    return {name: value * value for name, value in params.items()}


def _ratio(target: Any, have: Any, side: str, layer_index: int) -> Any:
    """``sqrt(target / have)``, the factor that brings squared norm ``have`` to ``target``."""
    xp = get_array_module(have)
    empty = have <= 0
    if bool(xp.any(empty)):
        i = int(xp.argmax(empty))
        raise ValueError(
            f"cannot balance: neuron {i} of layer{layer_index} has all-zero {side} weights, so no "
            "rescaling can give it the required norm. Initialise the weights first; an "
            "identity scheme on layers of unequal width leaves such neurons (use equal "
            "hidden widths)"
        )
    return xp.sqrt(target / have)


def _balanced(scheme: Scheme, beta: float) -> Scheme:
    def init(model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return balance(scheme(model, rng), beta=beta)

    init.__doc__ = f"{scheme.__name__} then balance(beta={beta}) (GAT-balance Procedure 2.6)."
    return init


INITIALISERS: dict[str, Scheme] = {
    "xavier": init_xavier,
    "xavier_normal": init_xavier_normal,
    "xavier_zero_att": init_xavier_zero_att,
    "orthogonal": init_orthogonal,
    "ll_orthogonal": init_ll_orthogonal,
    "identity": init_identity,
    "ll_identity": init_ll_identity,
    # GAT-balance Table 1 and Fig. 9
    "Xav": init_xavier_normal,
    "Xav_Z": init_xavier_zero_att,
    "Bal_X": _balanced(init_xavier_normal, 2.0),
    "Bal_O": _balanced(init_ll_orthogonal, 2.0),
    "Bal_identity": _balanced(init_identity, 1.0),
    "Bal_LLidentity": _balanced(init_ll_identity, 2.0),
}
