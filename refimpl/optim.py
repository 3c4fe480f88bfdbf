"""Functional optimisers with explicit state: SGD and Adam (L2 weight decay, PyTorch semantics).

An optimiser is a frozen configuration; its state is a flat dict of arrays that
the caller owns and threads through the loop::

    opt = Adam(lr=5e-3, weight_decay=5e-4)
    state = opt.init(params)
    params, state = opt.step(params, grads, state)   # pure: inputs are never mutated
    numpy.savez("ckpt.npz", **state)                 # no pickle
    state = opt.load_state(numpy.load("ckpt.npz"), params)  # resumes bit-identically

State layout: ``"step"`` (a 0-d int64 NumPy array on the host, on every backend: the number
of updates taken) and, for Adam, ``"m.<name>"`` and ``"v.<name>"`` (first and second
moments, one per parameter, in its shape, dtype and backend). ``params`` and ``grads``
are dicts of float arrays keyed alike (the layer protocol's ``d_params``). The math runs in
the array module of the parameters, so the same code runs on NumPy, CuPy and the strict
stand-in; hyperparameters are Python floats, so a float32 model stays
float32. Bias corrections are host scalars computed from the step count, as in
PyTorch's ``_single_tensor_adam``; the count stays on the host, so reading it costs no sync.
On a device backend Adam updates every parameter in one fused launch per dtype
(:mod:`refimpl.kernels.adam`, its operations the reference's, in the same order).

A step whose result is not finite raises (on NumPy one reduction per new parameter and
state array; on a device one flag for the whole step, read once, then those reductions if
it is set): :class:`NonFiniteUpdate` where the update itself overflowed finite inputs (a
learning rate or weight decay too large for the values),
:class:`~refimpl.validation.NonFiniteError` naming the input where one already held NaN or
infinity.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from refimpl.array_checks import check_grads, check_like_param, check_param_arrays
from refimpl.backend import asarray, backend_name, is_array
from refimpl.kernels.adam import AdamScalars, fused_adam_step
from refimpl.schedules import MultiStepLR, ReduceLROnPlateau, with_lr
from refimpl.validation import NonFiniteError, all_finite

__all__ = [
    "OPTIMIZERS",
    "SGD",
    "Adam",
    "MultiStepLR",  # learning-rate schedules, defined in refimpl.schedules
    "NonFiniteUpdate",
    "Optimizer",
    "ReduceLROnPlateau",
    "make_optimizer",
    "with_lr",
]

Params = Mapping[str, Any]
State = dict[str, Any]


class NonFiniteUpdate(NonFiniteError):
    """A step made ``key`` non-finite from finite parameters, gradients and state.

    Parameters
    ----------
    message : str
        The one-line message: what was made non-finite and what to change (``lr``).
    key : str, default ""
        A parameter's name, or (``in_state``) a state entry's such as ``"v.layer0.W"``.
    in_state : bool, default False
        Whether ``key`` names a state entry rather than a parameter.
    """

    def __init__(self, message: str, key: str = "", in_state: bool = False) -> None:
        super().__init__(message)
        self.key, self.in_state = key, in_state  # kept by pickle (the instance's __dict__)


class Optimizer(Protocol):
    """What the training loop needs from an optimiser; ``step`` raises
    :class:`NonFiniteUpdate` rather than return a non-finite parameter or state entry.

    Other Parameters
    ----------------
    *args, **kwargs : Any
        None: a protocol is not constructed; :class:`SGD` and :class:`Adam` implement it.
    """

    def init(self, params: Params) -> State: ...

    def step(
        self, params: Params, grads: Params, state: Mapping[str, Any]
    ) -> tuple[dict, State]: ...

    def load_state(self, state: Mapping[str, Any], params: Params | None = None) -> State: ...


@dataclass(frozen=True)
class SGD:
    """Plain gradient descent with L2 weight decay: ``w <- w - lr * (g + weight_decay * w)``.

    PyTorch parity: ``torch.optim.SGD(params, lr, weight_decay=weight_decay)``
    with its defaults (no momentum, dampening or Nesterov); the decay is added
    to the gradient (``grad.add(param, alpha=weight_decay)``), then
    ``param.add_(grad, alpha=-lr)``. State holds only the step count.

    Parameters
    ----------
    lr : float
        The learning rate, finite and ``> 0``; no default (torch has none for SGD).
    weight_decay : float, default 0.0
        The L2 penalty coefficient, finite and ``>= 0`` (the loss gains
        ``weight_decay / 2 * ||w||^2``).
    """

    lr: float  # no default: there is no good one for plain SGD
    weight_decay: float = 0.0  # L2 penalty coefficient (the loss gains wd/2 * ||w||^2)

    def __post_init__(self) -> None:
        _set_floats(self, lr=_check_real("SGD lr", self.lr, positive=True))
        _set_floats(self, weight_decay=_check_real("SGD weight_decay", self.weight_decay))

    def init(self, params: Params) -> State:
        """Fresh state: ``{"step": 0}`` (on the host)."""
        check_param_arrays(params)
        return {"step": np.asarray(0, dtype=np.int64)}

    def step(self, params: Params, grads: Params, state: Mapping[str, Any]) -> tuple[dict, State]:
        """One update; returns ``(new_params, new_state)`` without touching the inputs.

        Raises :class:`NonFiniteUpdate` if a new parameter is not finite (module docstring).
        """
        xp = check_param_arrays(params)
        check_grads(params, grads)
        step = _check_state(state, params, ())
        new_params = {}
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow: _check_update's line
            for name, w in params.items():
                g = grads[name]
                if self.weight_decay != 0:
                    g = g + self.weight_decay * w  # L2 decay through the gradient (coupled)
                new_params[name] = xp.asarray(w + (-self.lr) * g)  # NumPy: 0-d stays an array
        new_state = {"step": np.asarray(step + 1, dtype=np.int64)}
        _check_update("SGD", params, grads, state, new_params, new_state)
        return new_params, new_state

    def load_state(self, state: Mapping[str, Any], params: Params | None = None) -> State:
        """A plain state dict from a loaded ``.npz`` (or any mapping); see :func:`_load_state`."""
        return _load_state(state, params, ())


@dataclass(frozen=True)
class Adam:
    r"""Adam (Kingma & Ba 2015, Alg. 1) with L2 weight decay, as ``torch.optim.Adam``.

    With $t$ the step after the increment, $g = \nabla_w L + \lambda w$ ($\lambda$ =
    ``weight_decay``), Alg. 1's moments, their bias corrections and the update:

    $$
    m_t = \beta_1 m_{t-1} + (1 - \beta_1)\, g, \quad v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, g^2,
    \quad w_t = w_{t-1} - \mathrm{lr}\, \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t)}
    + \epsilon}.
    $$

    The code follows PyTorch's ``_single_tensor_adam`` (default on the CPU) op
    for op rather than the paper's wording, so float64 trajectories agree with
    torch to rounding: ``m`` by ``lerp(m, g, 1 - beta1)`` (ATen's two-branch
    lerp), ``v`` by ``v * beta2 + ((1 - beta2) * g) * g`` (``mul_`` then
    ``addcmul_``), ``denom = sqrt(v) / sqrt(1 - beta2^t) + eps`` and
    ``w + (-step_size * m) / denom`` with ``step_size = lr / (1 - beta1^t)``
    (``addcdiv_``). Note where eps sits: outside the square root and after the
    bias correction, as in Alg. 1 (Kingma & Ba's "eps-hat" variant of Sec. 2
    puts it before the correction). Not supported: ``amsgrad``, ``maximize``,
    decoupled decay (AdamW). Zero gradients with ``weight_decay=0`` leave a
    parameter exactly unchanged; the first update has ``|step| < lr``.

    Parameters
    ----------
    lr : float, default 1e-3
        The learning rate (Kingma & Ba's alpha), finite and ``> 0``. Defaults: the paper's
        and PyTorch's.
    betas : tuple of float, default (0.9, 0.999)
        ``(beta1, beta2)``, the moments' decay rates, each in ``[0, 1)``.
    eps : float, default 1e-8
        Added to ``sqrt(v_hat)`` in the denominator, finite and ``> 0``.
    weight_decay : float, default 0.0
        The L2 penalty added to the gradient (PyTorch's Adam, not AdamW), ``>= 0``.
    """

    lr: float = 1e-3  # Kingma & Ba's alpha; PyTorch default
    betas: tuple[float, float] = (0.9, 0.999)  # Kingma & Ba; PyTorch default
    eps: float = 1e-8  # Kingma & Ba; PyTorch default
    weight_decay: float = 0.0  # L2 penalty added to the gradient (PyTorch's Adam, not AdamW)

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"Adam betas must be a pair (beta1, beta2), got {self.betas!r}")
        betas = tuple(
            _check_real(f"Adam betas[{i}]", b, below_one=True) for i, b in enumerate(self.betas)
        )
        _set_floats(self, lr=_check_real("Adam lr", self.lr, positive=True), betas=betas)
        _set_floats(self, eps=_check_real("Adam eps", self.eps, positive=True))
        _set_floats(self, weight_decay=_check_real("Adam weight_decay", self.weight_decay))

    def init(self, params: Params) -> State:
        """Fresh state: step 0 (on the host) and zero moments ``m.<name>``, ``v.<name>`` like
        each parameter."""
        xp = check_param_arrays(params)
        state: State = {"step": np.asarray(0, dtype=np.int64)}
        for slot in ("m", "v"):
            state.update({f"{slot}.{k}": xp.zeros_like(w) for k, w in params.items()})
        return state

    def step(
        self, params: Params, grads: Params, state: Mapping[str, Any], flag: Any = None
    ) -> tuple[dict, State]:
        """One update; returns ``(new_params, new_state)`` without touching the inputs.

        Raises :class:`NonFiniteUpdate` if a new parameter, ``m`` or ``v`` is not finite
        (module docstring). On a device backend ``flag``, a zeroed ``(1,)`` int32 array there,
        takes the fused kernel's bits instead (:mod:`refimpl.kernels.adam`: 1 an entry not
        finite, 2 an entry of a parameter changed) and nothing is read: the caller reads it
        (:func:`refimpl.train.guards.checked_step`, with a training step's other checks).
        """
        xp = check_param_arrays(params)
        check_grads(params, grads)
        t = _check_state(state, params, ("m", "v")) + 1
        beta1, beta2 = self.betas
        # Host scalars, as torch computes them from step_t.item(): Python float pow.
        step_size = self.lr / (1 - beta1**t)
        bias_correction2_sqrt = (1 - beta2**t) ** 0.5
        if backend_name(xp) != "numpy":  # one launch per dtype, one sync per step
            scalars = (t, step_size, bias_correction2_sqrt)
            return self._fused_step(xp, params, grads, state, *scalars, flag)
        if flag is not None:
            raise ValueError("Adam.step takes a flag on a device backend only; pass flag=None")
        new_params, new_m, new_v = {}, {}, {}
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow: _check_update's line
            for name, w in params.items():
                g = grads[name]
                if self.weight_decay != 0:
                    g = g + self.weight_decay * w  # torch: grad.add(param, alpha=weight_decay)
                m = _lerp(state[f"m.{name}"], g, 1 - beta1)  # torch: exp_avg.lerp_(grad, 1 - b1)
                v = state[f"v.{name}"] * beta2 + ((1 - beta2) * g) * g  # mul_(beta2).addcmul_
                denom = xp.sqrt(v) / bias_correction2_sqrt + self.eps
                w = w + (-step_size * m) / denom  # torch: addcdiv_(m, denom, value=-step_size)
                # xp.asarray: NumPy arithmetic on 0-d arrays returns scalars; keep them arrays
                new_params[name] = xp.asarray(w)
                new_m[f"m.{name}"], new_v[f"v.{name}"] = xp.asarray(m), xp.asarray(v)
        new_state = {"step": np.asarray(t, dtype=np.int64), **new_m, **new_v}
        _check_update("Adam", params, grads, state, new_params, new_state)
        return new_params, new_state

    def _fused_step(
        self, xp: Any, params: Params, grads: Params, state: Any, t: int, step_size: float,
        bias_correction2_sqrt: float, flag: Any,
    ) -> tuple[dict, State]:  # fmt: skip
        """:meth:`step` on a device: every parameter's update in one launch per dtype
        (:func:`refimpl.kernels.adam.fused_adam_step`, the loop above op for op), and one
        flag for the whole step: the caller's, else read once (its 1 set,
        :func:`_check_update` says which entry)."""
        beta1, beta2 = self.betas
        scalars = AdamScalars(
            self.weight_decay, 1 - beta1, 1 - (1 - beta1), beta2, 1 - beta2,
            bias_correction2_sqrt, self.eps, -step_size, self.weight_decay != 0,
            abs(1 - beta1) < 0.5,
        )  # fmt: skip
        read = flag is None
        flag = xp.zeros(1, dtype=xp.int32) if read else flag
        names = list(params)
        w_news, ms, vs = fused_adam_step(
            xp, [params[k] for k in names], [grads[k] for k in names],
            [state[f"m.{k}"] for k in names], [state[f"v.{k}"] for k in names], scalars, flag,
        )  # fmt: skip
        new_params = dict(zip(names, w_news, strict=True))
        new_state = {"step": np.asarray(t, dtype=np.int64)}
        new_state.update({f"m.{k}": m for k, m in zip(names, ms, strict=True)})
        new_state.update({f"v.{k}": v for k, v in zip(names, vs, strict=True)})
        if read and int(flag[0]) & 1:  # the step's one sync
            _check_update("Adam", params, grads, state, new_params, new_state)
        return new_params, new_state

    def load_state(self, state: Mapping[str, Any], params: Params | None = None) -> State:
        """A plain state dict from a loaded ``.npz`` (or any mapping); see :func:`_load_state`."""
        return _load_state(state, params, ("m", "v"))


OPTIMIZERS: dict[str, type] = {"sgd": SGD, "adam": Adam}


def make_optimizer(name: str, **kwargs: Any) -> Optimizer:
    """``OPTIMIZERS[name](**kwargs)``: ``make_optimizer("adam", lr=5e-3, weight_decay=5e-4)``.

    Parameters
    ----------
    name : {"sgd", "adam"}
        The optimiser, in any case.
    **kwargs : Any
        Its configuration: the fields of :class:`SGD` or :class:`Adam`.

    Returns
    -------
    SGD or Adam
        The frozen configuration.
    """
    if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name.lower()](**kwargs)


def _lerp(start: Any, end: Any, weight: float) -> Any:
    """ATen's ``lerp`` (``ATen/native/Lerp.h``): exact at both ends of the weight range."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1 - weight)


def _check_real(name: str, value: Any, positive: bool = False, below_one: bool = False) -> float:
    """A finite real hyperparameter in its range, as a Python float (keeps float32 float32)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range (10**400): infinite as a float
        value = math.inf
    low_ok = value > 0 if positive else value >= 0
    if not math.isfinite(value) or not low_ok or (below_one and value >= 1):
        wanted = "> 0" if positive else ("in [0, 1)" if below_one else ">= 0")
        raise ValueError(f"{name} must be finite and {wanted}, got {value!r}")
    return value


def _check_update(
    owner: str,
    params: Params,
    grads: Params,
    state: Mapping[str, Any],
    new_params: Params,
    new_state: Mapping[str, Any],
) -> None:
    """Every new parameter, then every new state array (not ``"step"``), is finite; else
    :class:`NonFiniteUpdate` for the first that is not, or :class:`NonFiniteError` naming
    the input of that parameter that already held NaN or infinity."""
    for in_state, arrays in ((False, new_params), (True, new_state)):
        for key, value in arrays.items():
            if key == "step" or all_finite(value):
                continue
            name = key.split(".", 1)[1] if in_state else key  # "v.layer0.W" -> "layer0.W"
            inputs = {f"params[{name!r}]": params[name], f"grads[{name!r}]": grads[name]}
            inputs |= {f"state[{k!r}]": state[k] for k in state if k.split(".", 1)[-1] == name}
            bad = next((what for what, array in inputs.items() if not all_finite(array)), None)
            if bad is not None:
                raise NonFiniteError(
                    f"{owner}.step: {bad} holds NaN or infinity, so the update of {name!r} "
                    "cannot be finite; check the step that produced it"
                )
            made = f"state[{key!r}]" if in_state else f"params[{key!r}]"
            raise NonFiniteUpdate(
                f"{owner}.step made {made} non-finite from finite parameters, gradients and "
                "state; use a smaller lr (or weight_decay)",
                key,
                in_state,
            )


def _set_floats(obj: Any, **values: Any) -> None:
    for key, value in values.items():
        object.__setattr__(obj, key, value)  # frozen dataclass: normalise once, at construction


def _check_state(state: Mapping[str, Any], params: Params, slots: tuple[str, ...]) -> int:
    """``state`` matches ``params`` (one array per slot and parameter); returns the step count."""
    if not isinstance(state, Mapping) or "step" not in state:
        raise ValueError("state must be a dict with a 'step' entry; create it with opt.init")
    step = state["step"]
    if not (is_array(step) and step.shape == () and step.dtype.kind in "iu"):
        raise TypeError(f"state['step'] must be a 0-d integer array, got {step!r}")
    count = int(step)
    if count < 0:
        raise ValueError(f"state['step'] must be >= 0, got {count}")
    moments = {k: v for k, v in state.items() if k != "step"}
    expected = {f"{slot}.{k}" for slot in slots for k in params}
    if set(moments) != expected:
        missing, unexpected = sorted(expected - set(moments)), sorted(set(moments) - expected)
        raise ValueError(
            f"state keys must match the parameters: missing {missing}, unexpected {unexpected}; "
            "was it created by another optimiser or for another model?"
        )
    for slot in slots:
        for name, w in params.items():
            check_like_param(state[f"{slot}.{name}"], w, f"state[{slot + '.' + name!r}]", name)
    return count


def _load_state(state: Mapping[str, Any], params: Params | None, slots: tuple[str, ...]) -> State:
    """Copy ``state`` (e.g. ``numpy.load("ckpt.npz")``) into a plain dict, ready for ``step``.

    With ``params`` the arrays are moved to the parameters' backend and checked
    against them (keys, shapes, dtypes); without, they stay where they are.
    """
    if not isinstance(state, Mapping) or "step" not in state:
        raise ValueError("state must be a mapping with a 'step' entry (as saved from opt.init)")
    loaded = {k: state[k] for k in state}  # reads every array of an NpzFile once
    if params is not None:
        backend = backend_name(check_param_arrays(params))
        loaded = {k: asarray(v, backend=backend) for k, v in loaded.items()}
    step = loaded["step"]
    integer = getattr(step, "shape", None) == () and step.dtype.kind in "iu"
    if not (integer or (isinstance(step, int) and not isinstance(step, bool))):
        raise TypeError(f"state['step'] must be an integer, got {step!r}")
    loaded["step"] = np.asarray(int(step), dtype=np.int64)  # on the host; a saved int too
    if params is not None:
        _check_state(loaded, params, slots)
    for key, value in loaded.items():  # checked once here, not in every step
        if key == "step" or not is_array(value):
            continue
        if not all_finite(value):
            raise NonFiniteError(f"state[{key!r}] holds NaN or infinity: the state is damaged")
        if key.startswith("v.") and bool((value < 0).any()):  # Adam: sqrt(v) of a negative
            raise ValueError(f"state[{key!r}] holds negative second moments: the state is damaged")
    return loaded
