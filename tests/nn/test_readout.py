"""MLPReadout: finite differences, the released code's widths, torch parity, bad sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.nn.readout import MLPReadout
from refimpl.testing import check_gradients
from refimpl.testing.strategies import seeds
from refimpl.testing.tolerances import FORWARD_RTOL, GRADCHECK_RTOL, GRADIENT_RTOL

RTOL64 = FORWARD_RTOL[np.dtype(np.float64)]
GRAD64 = GRADIENT_RTOL[np.dtype(np.float64)]


@given(
    graphs=st.integers(0, 4),
    width=st.sampled_from([4, 5, 8, 13]),
    out=st.integers(1, 3),
    hidden=st.integers(0, 2),
    seed=seeds(),
)
def test_mlp_readout_backward_matches_central_differences(
    graphs: int, width: int, out: int, hidden: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    readout = MLPReadout(width, out, hidden)
    params = readout.init_params(rng)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}  # biases != 0
    x = rng.standard_normal((graphs, width))
    report = check_gradients(readout, params, (x,), max_entries=None)
    assert report.max_rel_error <= GRADCHECK_RTOL, report.table()


def test_mlp_readout_halves_the_width_as_the_released_code() -> None:
    # the released MLPReadout: nn.Linear(input_dim // 2**l, input_dim // 2**(l+1)), l < L
    shapes = MLPReadout(13, 2).param_shapes()
    assert shapes == {
        "fc0.W": (6, 13), "fc0.b": (6,), "fc1.W": (3, 6), "fc1.b": (3,),
        "fc2.W": (2, 3), "fc2.b": (2,),
    }  # fmt: skip


def test_mlp_readout_equals_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    readout = MLPReadout(16, 3)
    params = readout.init_params(rng)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}
    x, d_out = rng.standard_normal((5, 16)), rng.standard_normal((5, 3))
    out, cache = readout.forward(params, x)
    d_x, d_params = readout.backward(params, cache, d_out)
    # the released forward: relu after each hidden layer, none after the last
    tx = torch.tensor(x, requires_grad=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    y = tx
    for level in range(2):
        y = torch.relu(y @ tp[f"fc{level}.W"].T + tp[f"fc{level}.b"])
    y = y @ tp["fc2.W"].T + tp["fc2.b"]
    (y * torch.tensor(d_out)).sum().backward()
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=RTOL64, atol=0)
    np.testing.assert_allclose(d_x, tx.grad.numpy(), rtol=GRAD64, atol=0)
    for name, value in d_params.items():
        np.testing.assert_allclose(value, tp[name].grad.numpy(), rtol=GRAD64, atol=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3, 1), r"in_channels \(3\) halved 2 times leaves no unit"),
        ((4, 0), r"out_channels"),
        ((4, 1, -1), r"hidden_layers"),
    ],
)
def test_mlp_readout_refuses_sizes_in_one_line(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MLPReadout(*args)
