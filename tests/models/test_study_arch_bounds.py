"""The study architectures' boundaries: SAN's eigenpair validity read at one half, and the
attention weights drawn from their documented bounds. Each test's first comment names the
mutant of the mutation run (scripts/mutate.py, over the modules added since c116d75) that
showed the gap."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import Graph
from refimpl.models import GraphTransformer
from refimpl.nn.transformer.graphit_attention import GraphiTAttention
from refimpl.nn.transformer.san_attention import SANAttention
from refimpl.nn.transformer.san_lpe import eigenpairs_padded


# -- refimpl/models/arch_options.py: SAN's validity column read as > 0.5 ----------------------
def _san_inputs() -> tuple[GraphTransformer, dict, np.ndarray, Graph, np.ndarray, np.ndarray]:
    """A SAN model with a learned Laplacian encoding of 3 eigenpairs, its parameters, and a
    5-node batch of two graphs with the padded eigenpairs ``pe (5, 3, 3)``."""
    model = GraphTransformer(
        2, 1, hidden_channels=16, num_layers=1, heads=2, arch="san", lpe_eigenpairs=3,
        lpe_channels=4,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    graph = Graph(np.array([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]]), 5)
    batch = np.array([0, 0, 0, 1, 1])
    vectors, values, valid = eigenpairs_padded(graph, 3, np.array([0, 3, 5]))
    pe = np.stack([vectors, values, valid.astype(np.float64)], axis=2)
    return model, model.init_params(rng), rng.standard_normal((5, 2)), graph, pe, batch


@pytest.mark.parametrize("validity", [0.5, 0.25])
def test_a_node_whose_eigenpairs_are_all_marked_at_or_below_one_half_is_refused(
    validity: float,
) -> None:
    # Mutants b63f92a7ff (pe[:, :, 2] > 0.5 made >= 0.5) and b95a88cd24 (0.5 made 0.05) of
    # check_study_pe survived: every test passed validity 1.0 or 0.0, on which the three reads
    # agree. The model's forward reads the column as > 0.5 (study_archs), so a check that
    # counted 0.5 or 0.25 as valid would let a node with no eigenpair through.
    model, params, x, graph, pe, batch = _san_inputs()
    kwargs = {"batch": batch, "num_graphs": 2, "state": model.init_state()}
    pe[4, :, 2] = validity
    with pytest.raises(ValueError, match=r"marks valid eigenpairs .* every node needs"):
        model.forward(params, x, graph, None, pe, **kwargs)
    pe[4, 0, 2] = np.nextafter(0.5, 1.0)  # just above one half: a valid eigenpair
    out, _ = model.forward(params, x, graph, None, pe, **kwargs)
    assert out.shape == (2, 1) and np.isfinite(out).all()


# -- GraphiT's and SAN's attention: torch.nn.Linear's default init, U(-1/sqrt(D), 1/sqrt(D)) --
@pytest.mark.parametrize(
    "attention",
    [
        GraphiTAttention(8, heads=2, explicit_bias=True),
        GraphiTAttention(8, heads=2, full_graph=True),
        SANAttention(8, heads=2, full_graph=True, gamma=0.3),
    ],
    ids=["graphit-explicit-bias", "graphit-full", "san-full"],
)
def test_attention_init_draws_linear_default_bounds_in_parameter_order(
    attention: GraphiTAttention | SANAttention,
) -> None:
    # Mutants a0178359fe (GraphiTAttention.init_params's bound 1/sqrt(D) scaled by 1 + 1e-4)
    # and 8c6efe9cd9 (SANAttention.init_params's U(-bound, bound) made U(bound, bound), every
    # weight 1/sqrt(D)) survived: the layer tests move the parameters off their init or
    # compare with torch on copied weights, so no test read the init's distribution. The
    # same bounds in the same parameter order, replayed from the documented formula on an
    # equal generator, pin it.
    bound = 1.0 / np.sqrt(8)
    params = attention.init_params(np.random.default_rng(7))
    replay = np.random.default_rng(7)
    for name, shape in attention.param_shapes().items():
        if name == "gamma":
            expected = np.full(shape, 0.3)
        elif name.endswith("_bias"):  # GraphiT's explicit biases: the released torch.randn
            expected = replay.standard_normal(shape)
        else:
            expected = replay.uniform(-bound, bound, shape)
            assert np.abs(params[name]).max() <= bound, name
        np.testing.assert_array_equal(params[name], expected, err_msg=name)
