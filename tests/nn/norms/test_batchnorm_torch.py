"""BatchNorm against torch autograd, float64 (skipped without torch).

Two references, side by side with refimpl:

* ``torch.nn.BatchNorm1d`` itself: the module Dwivedi & Bresson's released GT layer
  (``graph_transformer_edge_layer.py``: ``nn.BatchNorm1d(out_dim)``, defaults) runs on the
  node and edge streams, stepped several times in training and then once in evaluation, each
  side carrying its own running statistics;
* a few lines of torch written from the equations (Ioffe & Szegedy 2015, Alg. 1, with
  torch's running-statistics update), on Hypothesis-drawn cases.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.nn.norms.batchnorm import BatchNorm
from refimpl.testing import max_relative_error
from refimpl.testing.strategies import seeds
from tests.autograd import compare_with_autograd
from tests.nn.norms.test_batchnorm import CONSTANT_COLUMN, TWO_ROWS, Case, cases, run_ours

torch = pytest.importorskip("torch")

STATISTICS = ["y", "running_mean", "running_var"]  # judged as outputs, the rest as gradients


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    # torch's CPU batch norm hands even a few rows to its thread pool, whose hand-off
    # dominates on a loaded machine; these tiny float64 inputs need one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def torch_batchnorm(
    norm: BatchNorm, params: dict, x: object, training: bool, state: dict
) -> tuple[object, object, object]:
    """``(y, running_mean', running_var')`` in torch from the equations, for autograd."""
    if training:
        mean = x.mean(dim=0)
        var = ((x - mean) ** 2).mean(dim=0)  # biased: normalises the batch
        unbiased = var * x.shape[0] / (x.shape[0] - 1)  # updates the running variance
        m = norm.momentum
        new_mean = (1 - m) * state["running_mean"] + m * mean.detach()
        new_var = (1 - m) * state["running_var"] + m * unbiased.detach()
    else:
        mean, var = state["running_mean"], state["running_var"]
        new_mean, new_var = mean, var
    y = (x - mean) / torch.sqrt(var + norm.eps)
    return (y * params["weight"] + params["bias"] if norm.affine else y), new_mean, new_var


def ours_by_name(case: Case) -> dict:
    """Our output, new running statistics and gradients, named as the references name them."""
    ours = run_ours(case)
    return {"x" if k == "d_x" else k.removeprefix("d_"): v for k, v in ours.items()}


@given(case=cases())
@example(case=TWO_ROWS)
@example(case=CONSTANT_COLUMN)
def test_matches_torch_written_from_the_equations(case: Case) -> None:
    def reference() -> dict:
        t_params = {k: torch.tensor(v, requires_grad=True) for k, v in case.params.items()}
        t_state = {k: torch.tensor(v) for k, v in case.state.items()}
        t_x = torch.tensor(case.x, requires_grad=True)
        y, mean, var = torch_batchnorm(case.norm, t_params, t_x, case.training, t_state)
        y.backward(torch.tensor(case.d_y))
        grads = {k: v.grad for k, v in t_params.items()}
        return {"y": y, "running_mean": mean, "running_var": var, "x": t_x.grad, **grads}

    comparison = compare_with_autograd(ours_by_name(case), reference, outputs=STATISTICS)
    assert comparison.passed, comparison.table()


def torch_module_step(norm: BatchNorm, case: Case, torch_state: dict) -> dict:
    """One step of ``torch.nn.BatchNorm1d`` holding ``case.params`` and ``torch_state``
    (torch's own running statistics so far): its output, new buffers and gradients."""
    module = torch.nn.BatchNorm1d(
        norm.channels, eps=norm.eps, momentum=norm.momentum, affine=norm.affine
    ).double()
    with torch.no_grad():
        for name, value in {**case.params, **torch_state}.items():
            getattr(module, name).copy_(torch.tensor(value))
    module.train(case.training)
    t_x = torch.tensor(case.x, requires_grad=True)
    y = module(t_x)
    y.backward(torch.tensor(case.d_y))
    grads = {k: v.grad for k, v in module.named_parameters()}
    buffers = {k: getattr(module, k).detach().clone() for k in ("running_mean", "running_var")}
    return {"y": y, **buffers, "x": t_x.grad, **grads}


@given(
    norm=st.builds(
        BatchNorm,
        st.integers(1, 4),
        momentum=st.sampled_from([0.1, 0.3, 1.0]),
        eps=st.sampled_from([1e-5, 1e-2]),
        affine=st.booleans(),
    ),
    sizes=st.lists(st.integers(2, 6), min_size=2, max_size=4),
    seed=seeds(),
)
def test_steps_of_torch_batchnorm1d_then_evaluation(
    norm: BatchNorm, sizes: list[int], seed: int
) -> None:
    # Training steps on batches of drawn sizes, then one evaluation step; each side carries
    # its own running statistics from torch's initial ones (zeros, ones).
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(v) for k, v in norm.param_shapes().items()}
    ours_state = norm.init_state()
    torch_state = {k: v.copy() for k, v in ours_state.items()}
    for step, rows in enumerate([*sizes, 3]):
        training = step < len(sizes)
        x = 2.0 * rng.standard_normal((rows, norm.channels)) + rng.standard_normal(norm.channels)
        case = Case(norm, params, x, ours_state, training, rng.standard_normal(x.shape))

        def reference(case: Case = case, torch_state: dict = torch_state) -> dict:
            return torch_module_step(norm, case, torch_state)

        ours = ours_by_name(case)
        comparison = compare_with_autograd(ours, reference, outputs=STATISTICS)
        assert comparison.passed, (step, comparison.table())
        ours_state = {k: ours[k] for k in ("running_mean", "running_var")}
        plain = reference()  # the comparison may have re-run it with perturbed rounding
        torch_state = {k: plain[k].numpy() for k in ("running_mean", "running_var")}


def test_running_statistics_need_torchs_momentum_and_unbiased_variance() -> None:
    # The parity above would also be met by a wrong update only if the two were
    # indistinguishable at its tolerance: here each plausible slip (the biased variance in
    # running_var; Keras's momentum convention, momentum on the old value) is shown to miss
    # torch's buffers by far more than rounding, while refimpl's update meets them.
    norm = BatchNorm(3)
    rng = np.random.default_rng(4)
    module = torch.nn.BatchNorm1d(3).double()  # the authors' configuration: all defaults
    state = norm.init_state()
    slips = {"biased": dict(state), "keras momentum": dict(state)}
    for rows in (4, 2, 5):
        x = rng.standard_normal((rows, 3)) * 3 + 1
        module(torch.tensor(x))
        _, cache = norm.forward(norm.init_params(None), x, True, state)
        state = cache.state
        mean, biased = x.mean(axis=0), x.var(axis=0)
        for name, slip in slips.items():
            batch_var = biased if name == "biased" else x.var(axis=0, ddof=1)
            old, new = (0.9, 0.1) if name == "biased" else (0.1, 0.9)
            slip["running_mean"] = old * slip["running_mean"] + new * mean
            slip["running_var"] = old * slip["running_var"] + new * batch_var
    torch_var = module.running_var.numpy()
    assert max_relative_error(state["running_var"], torch_var) <= 1e-15
    assert max_relative_error(state["running_mean"], module.running_mean.numpy()) <= 1e-15
    for name, slip in slips.items():
        assert max_relative_error(slip["running_var"], torch_var) > 1e-3, name
    assert (
        max_relative_error(slips["keras momentum"]["running_mean"], module.running_mean.numpy())
        > 1e-3
    )


def test_torch_refuses_training_on_one_row_as_we_do() -> None:
    module = torch.nn.BatchNorm1d(2).double()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        module(torch.zeros(1, 2, dtype=torch.float64))
    norm = BatchNorm(2)
    with pytest.raises(ValueError, match="at least 2 rows per channel"):
        norm.forward(norm.init_params(None), np.zeros((1, 2)), True, norm.init_state())
    module.eval()  # evaluation of no rows: an empty output on both sides
    assert tuple(module(torch.zeros(0, 2, dtype=torch.float64)).shape) == (0, 2)
