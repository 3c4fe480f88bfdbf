"""``MLPReadout``: the graph-level head of Dwivedi & Bresson's graph transformer, which the
massive-activation study's GT, GraphiT-GT and SAN all end with (the released code's
``layers/mlp_readout_layer.py``).

With ``D = in_channels`` and ``L = hidden_layers`` the widths halve at every hidden layer::

    for l = 0 .. L-1:
    F1  y = ReLU(y W_l^T + b_l)        (G, D / 2^l) -> (G, D / 2^(l+1))
    F2  out = y W_L^T + b_L            (G, D / 2^L) -> (G, out)

(``D / 2^l`` rounds down, as the released ``input_dim // 2 ** l``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from refimpl.fields import check_nonnegative_int, check_positive_int
from refimpl.nn.stacks import block_backward, flat_param_shapes, init_flat_params, split_params
from refimpl.ops.activations import ReLU, SignCache
from refimpl.ops.linear import Linear, LinearCache
from refimpl.validation import check_cotangent

__all__ = ["MLPReadout", "MLPReadoutCache"]


class MLPReadoutCache(NamedTuple):
    """What :meth:`MLPReadout.backward` reads.

    Attributes
    ----------
    linears : tuple of LinearCache
        F1 per hidden layer, then F2.
    relus : tuple of SignCache
        F1 per hidden layer.
    """

    linears: tuple[LinearCache, ...]
    relus: tuple[SignCache, ...]


@dataclass(frozen=True)
class MLPReadout:
    r"""``L`` ReLU layers halving the width, then a linear map to the outputs.

    Widths $D, D/2, \dots, D/2^L$, then ``out`` (Dwivedi & Bresson 2021, the released
    ``MLPReadout``):

    $$
    y_0 = x, \quad y_{l+1} = \operatorname{ReLU}(y_l W_l^\top + b_l) \ (l < L), \quad
    \mathrm{out} = y_L W_L^\top + b_L
    $$

    Parameters
    ----------
    in_channels : int
        ``D``, the pooled graph representation's width; ``D / 2^L`` must be at least 1.
    out_channels : int
        Targets (regression) or labels.
    hidden_layers : int, default 2
        ``L``, the released code's default.

    Shapes
    ------
    input ``(G, D)``, output ``(G, out_channels)``. Parameters ``fc{l}.W (D/2^(l+1), D/2^l)``,
    ``fc{l}.b``, ``l = 0 .. L-1``, then ``fc{L}.W (out, D/2^L)``, ``fc{L}.b`` (the released
    ``FC_layers[l]``); Glorot-uniform weights, zero biases.
    """

    in_channels: int
    out_channels: int
    hidden_layers: int = 2
    # the linear maps by parameter prefix, in parameter order; derived
    blocks: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int(self.in_channels, "MLPReadout in_channels")
        check_positive_int(self.out_channels, "MLPReadout out_channels")
        check_nonnegative_int(self.hidden_layers, "MLPReadout hidden_layers")
        if self.in_channels >> self.hidden_layers < 1:
            raise ValueError(
                f"MLPReadout in_channels ({self.in_channels}) halved {self.hidden_layers} times "
                f"leaves no unit: give in_channels >= {2**self.hidden_layers} or fewer "
                "hidden_layers"
            )
        widths = [self.in_channels >> level for level in range(self.hidden_layers + 1)]
        blocks = {
            f"fc{level}": Linear(widths[level], widths[level + 1])
            for level in range(self.hidden_layers)
        }
        blocks[f"fc{self.hidden_layers}"] = Linear(widths[-1], self.out_channels)
        object.__setattr__(self, "blocks", blocks)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Flat names ``fc{l}.W``, ``fc{l}.b`` and shapes, in order."""
        return flat_param_shapes(self.blocks)

    def init_params(
        self, rng: np.random.Generator, backend: str | None = None, dtype: Any = np.float64
    ) -> dict[str, Any]:
        """Glorot-uniform weights and zero biases, drawn from ``rng`` layer by layer."""
        return init_flat_params(self.blocks, rng, backend, dtype)

    def forward(self, params: dict[str, Any], x: Any) -> tuple[Any, MLPReadoutCache]:
        """``out (G, out_channels)`` for ``x (G, D)``, and the cache."""
        linears, relus = [], []
        y = x
        for level in range(self.hidden_layers):
            # F1 a hidden layer (G, D / 2^(l+1))
            prefix = f"fc{level}"
            y, linear = self.blocks[prefix].forward(split_params(self.blocks, params, prefix), y)
            y, relu = ReLU().forward({}, y)
            linears.append(linear)
            relus.append(relu)
        # F2 the output layer (G, out)
        prefix = f"fc{self.hidden_layers}"
        out, linear = self.blocks[prefix].forward(split_params(self.blocks, params, prefix), y)
        linears.append(linear)
        return out, MLPReadoutCache(tuple(linears), tuple(relus))

    def backward(
        self, params: dict[str, Any], cache: MLPReadoutCache, d_out: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients of ``<d_out, out>``: ``(d_x (G, D), d_params)``."""
        x = cache.linears[-1].x  # (G, D / 2^L), the last layer's input
        check_cotangent(d_out, (x.shape[0], self.out_channels), x.dtype, x, name="d_out")
        d_params: dict[str, Any] = {}
        # B2 (of F2) the output layer
        last = self.hidden_layers
        d_y = block_backward(self.blocks, params, f"fc{last}", cache.linears[last], d_out, d_params)
        for level in reversed(range(self.hidden_layers)):
            # B1 (of F1) a hidden layer
            d_y, _ = ReLU().backward({}, cache.relus[level], d_y)
            d_y = block_backward(
                self.blocks, params, f"fc{level}", cache.linears[level], d_y, d_params
            )
        return d_y, {name: d_params[name] for name in params}
