"""Tests for refimpl.optim: torch parity, an independent Adam, purity, checkpoints, backends."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl import optim
from refimpl.backend import asarray, to_numpy
from refimpl.optim import OPTIMIZERS, SGD, Adam, NonFiniteUpdate, make_optimizer
from refimpl.testing import FORWARD_RTOL, max_relative_error
from refimpl.testing.strategies import seeds
from refimpl.validation import NonFiniteError
from tests.backends import DEVICE_BACKENDS

# Against torch.optim in float64 over 60 steps. The two sides run the same ops in
# the same order except where ATen fuses a multiply-add (lerp, add with alpha):
# one rounding there, two here, so each step's update differs by a few ulps of
# itself, and the parameters by ~T * 4 * 1.1e-16 ~ 3e-14 of the path length
# (sum of the updates), which here is comparable to the parameters' scale.
# Normwise (max |diff| / max |torch|): an entry that crosses zero is not judged
# against itself. Measured: <= 2.3e-16 (Adam), <= 5.4e-16 (SGD).
TORCH_RTOL = 1e-13
SHAPES = {"layer0.W": (4, 3), "layer0.b": (4,), "att": (2, 1, 3), "scale": ()}


def make_params(rng, dtype=np.float64, shapes=SHAPES):
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def grad_sequence(rng, params, steps):
    """Gradients of mixed scales (1e-3 to 1e3) so that v spans orders of magnitude."""
    return [
        {
            k: np.asarray(rng.standard_normal(w.shape) * 10.0 ** rng.integers(-3, 4), w.dtype)
            for k, w in params.items()
        }
        for _ in range(steps)
    ]


def run(opt, params, grads_seq, state=None):
    """The trajectory of parameters (one dict per step) and the final state."""
    state = opt.init(params) if state is None else state
    trajectory = []
    for grads in grads_seq:
        params, state = opt.step(params, grads, state)
        trajectory.append(params)
    return trajectory, state


CONFIGS = [
    pytest.param(Adam(lr=1e-2), id="adam"),
    pytest.param(Adam(lr=3e-2, weight_decay=0.1), id="adam-wd"),
    pytest.param(Adam(1e-3, (0.5, 0.3), eps=1e-6, weight_decay=5e-4), id="adam-lerp-branch"),
    pytest.param(SGD(lr=1e-2), id="sgd"),
    pytest.param(SGD(lr=5e-3, weight_decay=0.1), id="sgd-wd"),
]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("opt", CONFIGS)
def test_matches_torch_optim_over_60_steps(opt, foreach):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    params = make_params(rng)
    grads_seq = grad_sequence(rng, params, 60)
    tensors = [torch.tensor(w, requires_grad=True) for w in params.values()]
    if isinstance(opt, Adam):
        ref = torch.optim.Adam(
            tensors, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay,
            foreach=foreach,
        )  # fmt: skip
    else:
        ref = torch.optim.SGD(tensors, lr=opt.lr, weight_decay=opt.weight_decay, foreach=foreach)
    trajectory, state = run(opt, params, grads_seq)
    for step, (grads, ours) in enumerate(zip(grads_seq, trajectory, strict=True)):
        for tensor, g in zip(tensors, grads.values(), strict=True):
            tensor.grad = torch.tensor(g)
        ref.step()
        for tensor, (name, w) in zip(tensors, ours.items(), strict=True):
            error = max_relative_error(w, tensor.detach().numpy())
            assert error <= TORCH_RTOL, (step, name, error)
    assert int(state["step"]) == 60
    if isinstance(opt, Adam):
        for tensor, name in zip(tensors, params, strict=True):
            for slot, key in (("m", "exp_avg"), ("v", "exp_avg_sq")):
                torch_moment = ref.state[tensor][key].numpy()
                assert max_relative_error(state[f"{slot}.{name}"], torch_moment) <= TORCH_RTOL


def kingma_ba_adam(params, grads_seq, lr, betas, eps, weight_decay):
    """Kingma & Ba (2015) Alg. 1 as printed, plus PyTorch's L2 term.

    Returns the final parameters and the path length (sum over steps of the
    largest update), the scale on which two roundings of the run can differ.
    """
    beta1, beta2 = betas
    path = 0.0
    theta = {k: w.copy() for k, w in params.items()}
    m = {k: np.zeros_like(w) for k, w in params.items()}
    v = {k: np.zeros_like(w) for k, w in params.items()}
    for t, grads in enumerate(grads_seq, start=1):
        for k in theta:
            g = grads[k] + weight_decay * theta[k]
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g**2
            m_hat = m[k] / (1 - beta1**t)
            v_hat = v[k] / (1 - beta2**t)
            update = lr * m_hat / (np.sqrt(v_hat) + eps)
            theta[k] = theta[k] - update
            path += float(np.max(np.abs(update)))
    return theta, path


@given(
    seed=seeds(),
    steps=st.integers(1, 40),
    lr=st.sampled_from([1e-3, 1e-2, 0.1]),
    betas=st.tuples(st.sampled_from([0.0, 0.5, 0.9, 0.99]), st.sampled_from([0.9, 0.999])),
    eps=st.sampled_from([1e-8, 1e-3]),
    weight_decay=st.sampled_from([0.0, 5e-4, 0.1]),
)
def test_adam_matches_kingma_ba_transcription(seed, steps, lr, betas, eps, weight_decay):
    rng = np.random.default_rng(seed)
    params = make_params(rng)
    grads_seq = grad_sequence(rng, params, steps)
    trajectory, _ = run(Adam(lr, betas, eps, weight_decay), params, grads_seq)
    expected, path = kingma_ba_adam(params, grads_seq, lr, betas, eps, weight_decay)
    # Same algebra, different rounding (m_hat and v_hat formed explicitly, m by
    # b1 m + (1 - b1) g, not lerp): each step differs by a few ulps of that step's
    # update, so the runs differ by ulps of the parameters plus the path length.
    scale = max(float(np.max(np.abs(w))) for w in expected.values()) + path
    for name, w in trajectory[-1].items():
        error = float(np.max(np.abs(w - expected[name])))
        assert error <= FORWARD_RTOL[np.dtype(np.float64)] * scale, (name, error)


@pytest.mark.parametrize("weight_decay", [0.0, 0.3])
def test_sgd_is_exactly_the_formula(weight_decay):
    rng = np.random.default_rng(1)
    params = make_params(rng)
    grads = grad_sequence(rng, params, 1)[0]
    new, state = SGD(0.05, weight_decay).step(params, grads, SGD(0.05).init(params))
    for k, w in params.items():
        np.testing.assert_array_equal(new[k], w - 0.05 * (grads[k] + weight_decay * w))
    assert int(state["step"]) == 1


def test_adam_first_step_is_below_lr_and_zero_gradient_is_a_fixed_point():
    # Kingma & Ba Sec. 2.1: at t = 1, m_hat / sqrt(v_hat) = g / |g|, so |step| < lr.
    rng = np.random.default_rng(2)
    params = make_params(rng)
    grads = grad_sequence(rng, params, 1)[0]
    opt = Adam(lr=0.1)
    new, _ = opt.step(params, grads, opt.init(params))
    for k, w in params.items():
        assert np.all(np.abs(new[k] - w) <= 0.1)
    zeros = {k: np.zeros_like(w) for k, w in params.items()}
    same, _ = run(opt, params, [zeros] * 3)
    for k, w in params.items():
        np.testing.assert_array_equal(same[-1][k], w)


@pytest.mark.parametrize("opt", CONFIGS)
def test_step_is_pure_and_keeps_zero_d_arrays(opt):
    rng = np.random.default_rng(3)
    params = make_params(rng)
    state = run(opt, params, grad_sequence(rng, params, 2))[1]  # non-zero moments
    grads = grad_sequence(rng, params, 1)[0]
    copies = [{k: v.copy() for k, v in d.items()} for d in (params, grads, state)]
    new_params, new_state = opt.step(params, grads, state)
    for original, copy in zip((params, grads, state), copies, strict=True):
        assert original.keys() == copy.keys()
        for k in copy:
            np.testing.assert_array_equal(original[k], copy[k])
    # NumPy turns 0-d arithmetic into scalars; the optimiser must hand back arrays.
    assert isinstance(new_params["scale"], np.ndarray) and new_params["scale"].shape == ()
    assert all(isinstance(v, np.ndarray) for v in new_state.values())
    assert new_state["step"].shape == () and new_state["step"].dtype == np.int64
    assert int(new_state["step"]) == 3


@pytest.mark.parametrize("via_load_state", [False, True])
@pytest.mark.parametrize("opt", CONFIGS)
def test_checkpoint_round_trip_continues_bit_identically(opt, via_load_state, tmp_path):
    rng = np.random.default_rng(4)
    params = make_params(rng)
    grads_seq = grad_sequence(rng, params, 10)
    straight, _ = run(opt, params, grads_seq)

    first, state = run(opt, params, grads_seq[:4])
    np.savez(tmp_path / "ckpt.npz", **state)  # flat dict of arrays: no pickle needed
    with np.load(tmp_path / "ckpt.npz", allow_pickle=False) as loaded:
        resumed = opt.load_state(loaded, params) if via_load_state else dict(loaded)
    rest, _ = run(opt, first[-1], grads_seq[4:], state=resumed)
    for k in params:
        np.testing.assert_array_equal(rest[-1][k], straight[-1][k])


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("opt", CONFIGS)
def test_device_backend_matches_numpy(opt, backend):
    rng = np.random.default_rng(5)
    params = make_params(rng)
    grads_seq = grad_sequence(rng, params, 5)
    host, host_state = run(opt, params, grads_seq)
    device, device_state = run(
        opt,
        {k: asarray(w, backend=backend) for k, w in params.items()},
        [{k: asarray(g, backend=backend) for k, g in grads.items()} for grads in grads_seq],
    )
    # strict is NumPy underneath: the same ops, bit for bit; CuPy may round differently
    rtol = 0.0 if backend == "strict" else FORWARD_RTOL[np.dtype(np.float64)]
    for k in host_state:
        assert max_relative_error(device_state[k], host_state[k]) <= rtol, k
    for k in params:
        assert max_relative_error(device[-1][k], host[-1][k]) <= rtol, k
    # a checkpoint saved from the device resumes there through load_state
    host_copy = {k: to_numpy(v) for k, v in device_state.items()}
    resumed = opt.load_state(host_copy, device[-1])
    opt.step(device[-1], {k: asarray(g, backend=backend) for k, g in grads_seq[0].items()}, resumed)


@pytest.mark.parametrize("opt", CONFIGS)
def test_float32_stays_float32(opt):
    rng = np.random.default_rng(6)
    params = make_params(rng, dtype=np.float32)
    # NumPy-scalar hyperparameters would promote float32 to float64 (NEP 50)
    opt = type(opt)(**{**vars(opt), "lr": np.float64(opt.lr)})
    trajectory, state = run(opt, params, grad_sequence(rng, params, 3))
    assert all(w.dtype == np.float32 for w in trajectory[-1].values())
    assert all(v.dtype == np.float32 for k, v in state.items() if k != "step")


def test_registry():
    assert OPTIMIZERS == {"sgd": SGD, "adam": Adam}
    assert make_optimizer("adam", lr=5e-3, weight_decay=5e-4) == Adam(5e-3, weight_decay=5e-4)
    assert make_optimizer("SGD", lr=0.1) == SGD(0.1)
    with pytest.raises(ValueError, match=r"unknown optimizer 'rmsprop'; choose one of sgd, adam"):
        make_optimizer("rmsprop", lr=0.1)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: SGD(0.0), ValueError, r"lr must be finite and > 0, got 0\.0"),
        (lambda: SGD(float("nan")), ValueError, r"lr must be finite"),
        (lambda: SGD("0.1"), TypeError, r"lr must be a real number, got str"),
        (lambda: SGD(0.1, weight_decay=-1e-4), ValueError, r"weight_decay must be .* >= 0"),
        (lambda: Adam(betas=(0.9, 1.0)), ValueError, r"betas\[1\] must be finite and in \[0, 1\)"),
        (lambda: Adam(betas=(-0.1, 0.9)), ValueError, r"betas\[0\]"),
        (lambda: Adam(betas=(0.9,)), ValueError, r"betas must be a pair"),
        (lambda: Adam(eps=0.0), ValueError, r"eps must be finite and > 0"),
        # each option finite and in range (pinned one by one); an int beyond float range
        # escaped as an OverflowError traceback, float() raising before the range check
        (lambda: SGD(math.inf), ValueError, r"^SGD lr must be finite and > 0, got inf$"),
        (lambda: SGD(10**400), ValueError, r"^SGD lr must be finite and > 0, got inf$"),
        (lambda: Adam(weight_decay=math.inf), ValueError, r"^Adam weight_decay must be finite"),
        (lambda: Adam(eps=math.nan), ValueError, r"^Adam eps must be finite and > 0, got nan$"),
        (lambda: Adam(eps=math.inf), ValueError, r"^Adam eps must be finite and > 0, got inf$"),
        (lambda: Adam(betas=(math.nan, 0.9)), ValueError, r"^Adam betas\[0\] must be finite"),
        (lambda: Adam(lr=-1e-3), ValueError, r"^Adam lr must be finite and > 0, got -0\.001$"),
    ],
)
def test_hyperparameter_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def _step_with(opt, params=None, grads=None, state=None):
    base = {"W": np.ones((2, 3)), "b": np.zeros(2)}
    params = base if params is None else params
    state = opt.init(base) if state is None else state
    grads = {k: np.ones_like(w) for k, w in base.items()} if grads is None else grads
    return opt.step(params, grads, state)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"grads": {"W": np.ones((2, 3))}}, ValueError, r"grads keys .* missing \['b'\]"),
        (
            {"grads": {"W": np.ones((2, 3)), "b": np.ones(2), "c": np.ones(1)}},
            ValueError,
            r"unexpected \['c'\]",
        ),
        ({"grads": {"W": np.ones((3, 2)), "b": np.ones(2)}}, ValueError, r"grads\['W'\] has shape"),
        (
            {"grads": {"W": np.ones((2, 3), np.float32), "b": np.ones(2)}},
            TypeError,
            r"grads\['W'\] has dtype float32 but params\['W'\] has float64",
        ),
        ({"grads": {"W": 1.0, "b": np.ones(2)}}, TypeError, r"grads\['W'\] must be an array"),
        (
            {"params": {"W": np.ones((2, 3), int), "b": np.zeros(2)}},
            TypeError,
            r"params\['W'\] must be a floating-point array",
        ),
        ({"state": {"step": np.asarray(0)}}, ValueError, r"state keys .* missing \['m\.W'"),
        ({"state": {"m.W": np.ones(1)}}, ValueError, r"'step' entry"),
        (
            {"grads": {"W": asarray(np.ones((2, 3)), backend="strict"), "b": np.ones(2)}},
            TypeError,
            r"grads\['W'\] lives on another backend",
        ),
    ],
)
def test_step_errors_name_the_offending_key(kwargs, error, match):
    with pytest.raises(error, match=match):
        _step_with(Adam(), **kwargs)


def test_numpy_state_with_device_params_points_to_load_state():
    params = {"W": asarray(np.ones(3), backend="strict")}
    state = {k: to_numpy(v) for k, v in Adam().init(params).items()}
    with pytest.raises(TypeError, match=r"opt\.load_state\(state, params\)"):
        Adam().step(params, {"W": asarray(np.ones(3), backend="strict")}, state)


@pytest.mark.parametrize("weight", [0.0, 0.1, 0.4999, 0.5, 0.9, 1.0])
def test_lerp_takes_atens_branch_for_each_weight(weight: float) -> None:
    # Guards _lerp's branch point (mutants: < 5.0, < 0.05 and <= 0.5 all passed the torch
    # comparisons, the branches differing by an ulp): ATen's lerp (ATen/native/Lerp.h) is
    # start + w (end - start) for |w| < 0.5 and end - (end - start) (1 - w) otherwise, so it
    # is exact at both ends. Checked bit for bit where the two branches differ.
    rng = np.random.default_rng(10)
    start, end = rng.standard_normal(1000), rng.standard_normal(1000)
    low, high = start + weight * (end - start), end - (end - start) * (1 - weight)
    assert np.any(low != high)  # the branches differ on these values: the test has teeth
    expected = low if abs(weight) < 0.5 else high
    np.testing.assert_array_equal(optim._lerp(start, end, weight), expected)
    if weight in (0.0, 1.0):
        np.testing.assert_array_equal(expected, start if weight == 0.0 else end)


@pytest.mark.parametrize(
    "opt",
    [Adam(lr=1e308), Adam(weight_decay=1e308), SGD(0.1, weight_decay=1e308)],
    ids=["adam_lr", "adam_weight_decay", "sgd_weight_decay"],
)
def test_an_overflowing_update_raises_instead_of_returning_infinite_parameters(opt):
    # These returned infinite parameters (with NumPy's overflow warnings) and no error: only
    # the training loop's guard looked at the result of a step, so a direct caller, and the
    # reliability harness, got inf; the tests here used moderate rates only.
    params, grads = {"w": np.array([1.0, -2.0, 0.5])}, {"w": np.array([0.3, 0.1, -0.2])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the one line below says it all
        with pytest.raises(NonFiniteUpdate) as error:
            opt.step(params, grads, opt.init(params))
    name = type(opt).__name__
    assert str(error.value) == (
        f"{name}.step made params['w'] non-finite from finite parameters, gradients and "
        "state; use a smaller lr (or weight_decay)"
    )
    assert isinstance(error.value, NonFiniteError)
    assert (error.value.key, error.value.in_state) == ("w", False)
    # a worker process sends it back pickled: what the guard reads survives
    copy = pickle.loads(pickle.dumps(error.value))
    assert (str(copy), copy.key, copy.in_state) == (str(error.value), "w", False)


def test_an_overflowing_second_moment_names_the_state_entry():
    # float32 v = g^2 overflows for |g| > 1.8e19 while the parameter stays finite (m / sqrt(v)
    # is 0): the state is what went wrong, and what the error names.
    params = {"W": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    grads = {"W": np.ones(3, np.float32), "b": np.full(2, 1e21, np.float32)}
    opt = Adam()
    with pytest.raises(NonFiniteUpdate, match=r"^Adam\.step made state\['v\.b'\] non-finite"):
        opt.step(params, grads, opt.init(params))


@pytest.mark.parametrize("where", ["params", "grads", "state"])
def test_a_non_finite_input_is_named_not_blamed_on_the_learning_rate(where):
    params, grads = {"W": np.ones(3), "b": np.ones(2)}, {"W": np.ones(3), "b": np.ones(2)}
    opt = Adam()
    state = opt.init(params)
    damaged = {"params": params, "grads": grads, "state": state}[where]
    key = "m.b" if where == "state" else "b"
    damaged[key] = np.array([1.0, np.nan])
    with pytest.raises(NonFiniteError) as error:
        opt.step(params, grads, state)
    assert not isinstance(error.value, NonFiniteUpdate)
    assert str(error.value).startswith(f"Adam.step: {where}[{key!r}] holds NaN or infinity")


# -- the fused device update (refimpl.kernels.adam) ---------------------------------------------


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.3, 0.99)], ids=["near_start", "far_branch"])
def test_fused_adam_twin_is_the_reference_update_bit_for_bit(dtype, weight_decay, betas, backend):
    # The strict stand-in runs adam_twin (the kernel's order, one launch) where NumPy runs the
    # literal sequence; equal bit for bit over steps whose gradients span 1e-3 to 1e3, on both
    # branches of ATen's lerp (1 - beta1 below and above 0.5) and with and without decay. On
    # CuPy the kernel itself (--fmad=false; no subnormal arises at these scales).
    rng = np.random.default_rng(11)
    params = make_params(rng, dtype)
    grads_seq = grad_sequence(rng, params, 4)
    opt = Adam(lr=5e-3, betas=betas, weight_decay=weight_decay)
    host, host_state = run(opt, params, grads_seq)
    device, device_state = run(
        opt,
        {k: asarray(w, backend=backend) for k, w in params.items()},
        [{k: asarray(g, backend=backend) for k, g in grads.items()} for grads in grads_seq],
    )
    for k in host_state:
        np.testing.assert_array_equal(to_numpy(device_state[k]), host_state[k], err_msg=k)
        assert to_numpy(device_state[k]).dtype == host_state[k].dtype
    for k in params:
        np.testing.assert_array_equal(to_numpy(device[-1][k]), host[-1][k], err_msg=k)


def test_fused_adam_is_one_launch_and_one_sync():
    # Issue 38: Adam made 15 launches per parameter, an int(step) sync and a host copy of t
    # each step, and one finiteness check (a reduction and a sync) per new array; then one
    # fused launch per parameter; now one for all of them.
    from refimpl.testing.strict import count_launches

    rng = np.random.default_rng(12)
    params = {k: asarray(w, backend="strict") for k, w in make_params(rng).items()}
    grads = {k: asarray(g, backend="strict") for k, g in grad_sequence(rng, params, 1)[0].items()}
    opt = Adam(weight_decay=5e-4)
    state = opt.init(params)
    with count_launches() as counts:
        _, state = opt.step(params, grads, state)
    # one fused update of every parameter, plus the zeroed flag; the flag's read is the sync
    assert (counts.launches, counts.syncs, counts.copies) == (2, 1, 0)
    assert isinstance(state["step"], np.ndarray) and int(state["step"]) == 1  # on the host


def test_fused_adam_launches_once_per_dtype_and_group_and_keeps_each_parameter_in_place():
    # The kernel takes one dtype and at most GROUP parameters per launch: a model of mixed
    # dtypes, or of more parameters than one launch's arguments hold, is split, and every
    # result must still land at its own name, bitwise the reference's (a slip in the
    # regrouping would swap two parameters' updates).
    from refimpl.kernels.adam import GROUP
    from refimpl.testing.strict import count_launches

    rng = np.random.default_rng(13)
    shapes = [(3,), (2, 2), (), (5,)] * (GROUP // 2)  # 2 in 3 float32: more than GROUP
    host = {
        f"p{k}": rng.normal(size=shape).astype(np.float32 if k % 3 else np.float64)
        for k, shape in enumerate(shapes)
    }
    grads = {k: rng.normal(size=w.shape).astype(w.dtype) for k, w in host.items()}
    opt = Adam(lr=1e-2, weight_decay=1e-3)
    expected, expected_state = opt.step(host, grads, opt.init(host))
    device = {k: asarray(w, backend="strict") for k, w in host.items()}
    device_grads = {k: asarray(g, backend="strict") for k, g in grads.items()}
    state = opt.init(device)
    with count_launches() as counts:
        got, got_state = opt.step(device, device_grads, state)
    per_dtype = [sum(w.dtype == dtype for w in host.values()) for dtype in (np.float32, np.float64)]
    assert counts.launches == 1 + sum(-(-n // GROUP) for n in per_dtype)
    assert max(per_dtype) > GROUP  # the split is exercised
    assert list(got) == list(expected) and list(got_state) == list(expected_state)
    for k in expected:
        np.testing.assert_array_equal(to_numpy(got[k]), expected[k], err_msg=k)
        assert to_numpy(got[k]).dtype == expected[k].dtype and got[k].shape == expected[k].shape
    for k in expected_state:
        np.testing.assert_array_equal(to_numpy(got_state[k]), expected_state[k], err_msg=k)


def test_fused_adam_refuses_a_dtype_its_kernel_lacks():
    # The kernel is made for float and double: a float16 parameter is refused in one line
    # naming the dtype, not handed to a kernel that would read its bytes as floats.
    from refimpl.kernels.adam import AdamScalars, fused_adam_step
    from refimpl.testing import strict

    w = asarray(np.ones(3, np.float16), backend="strict")
    scalars = AdamScalars(0.0, 0.1, 0.9, 0.999, 0.001, 1.0, 1e-8, -1e-3, False, True)
    with pytest.raises(TypeError, match=r"float32 or float64 parameters, got float16"):
        fused_adam_step(strict, [w], [w], [w], [w], scalars, strict.zeros(1, dtype=np.int32))
    with pytest.raises(ValueError, match=r"runs on a device backend, not 'numpy'"):
        fused_adam_step(np, [np.ones(3)], [np.ones(3)], [np.ones(3)], [np.ones(3)], scalars, None)


@pytest.mark.parametrize(
    "opt, grad",
    [(Adam(lr=1e308), 0.3), (Adam(weight_decay=1e308), 0.3), (Adam(), 1e21)],
    ids=["lr", "weight_decay", "second_moment"],
)
def test_fused_adam_raises_what_the_reference_raises(opt, grad):
    # The device path reads one flag per step and, when it is set, runs the same check as
    # NumPy's path: the same exception and the same line, naming the same entry.
    host = {"W": np.ones(3, np.float32), "b": np.array([1.0, -2.0], np.float32)}
    grads = {"W": np.ones(3, np.float32), "b": np.full(2, grad, np.float32)}
    with pytest.raises(NonFiniteUpdate) as expected:
        opt.step(host, grads, opt.init(host))
    device = {k: asarray(v, backend="strict") for k, v in host.items()}
    device_grads = {k: asarray(v, backend="strict") for k, v in grads.items()}
    with pytest.raises(NonFiniteUpdate) as got:
        opt.step(device, device_grads, opt.init(device))
    assert str(got.value) == str(expected.value)
    assert (got.value.key, got.value.in_state) == (expected.value.key, expected.value.in_state)


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_adam_kernel_compiles_to_ptx_without_float_atomics_or_contraction(dtype, tmp_path):
    # The bitwise claim rests on --fmad=false (no fma.rn: every product rounded, as the
    # twin's) and on the flag being an integer OR (atom.or.b32, no floating-point atomic).
    import shutil
    import subprocess

    from refimpl.kernels.adam import ADAM_OPTIONS, cuda_sources

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the kernel's CUDA source cannot be compiled here")
    source, ptx = tmp_path / "adam.cu", tmp_path / "adam.ptx"
    source.write_text(cuda_sources()[f"adam_{dtype}"])
    subprocess.run(["nvcc", "-ptx", *ADAM_OPTIONS, "-o", str(ptx), str(source)], check=True)
    text = ptx.read_text()
    assert "atom.global.or.b32" in text  # the flag: compiled, and an integer atomic
    assert not [line for line in text.splitlines() if "atom" in line and ".f" in line]
    assert "sqrt.rn" in text and "div.rn" in text  # IEEE-rounded, as NumPy's
    assert "fma." not in text  # nothing contracted
    # the check has teeth: without --fmad=false nvcc does contract the update
    subprocess.run(["nvcc", "-ptx", "-o", str(ptx), str(source)], check=True)
    assert "fma.rn" in ptx.read_text()
