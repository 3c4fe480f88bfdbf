"""Adam's update of every parameter in one fused device kernel, beside its NumPy twin.

:class:`refimpl.optim.Adam` performs the operations of PyTorch's ``_single_tensor_adam`` one
array at a time, a device launch each (15 per parameter). :data:`ADAM_OPERATION` performs the
same operations, in the same order and in the parameters' dtype, on one entry; the kernel
(:func:`cuda_source`, made per dtype and number of parameters, like PyTorch's multi-tensor
``_foreach`` updates) runs it on every entry of every parameter of one dtype in one launch:

    F1  thread i takes entry i of the parameters laid end to end, in the order given: the
        first whose size exceeds what is left of i, at i minus the sizes before it
    S1-S7  :data:`ADAM_OPERATION` on that entry (below)

The pointers and sizes travel as kernel arguments (no table copied to the device; at most
:data:`GROUP` parameters per launch, so they fit CUDA's 4 KiB of arguments).
:func:`adam_twin` is the NumPy twin, written step for step in the kernel's order (``S1`` ...
``S7``), which the strict stand-in runs as the one launch the kernel is
(:func:`refimpl.testing.strict.run_kernel`); :func:`cuda_sources` writes the kernel out for
``nvcc`` (the PTX tests). ``tests/test_optim.py`` holds the twin bitwise equal to the
reference update on NumPy (both branches of ATen's ``lerp``, with and without weight decay,
float32 and float64). Every entry is independent of the others, so the twin's order over
the parameters and the threads' order cannot change a bit.

Bitwise, and where not: the kernel is compiled with ``--fmad=false``, so no product is
contracted into a multiply-add (the reference rounds every product); square root and
division are IEEE-rounded (NVRTC's defaults ``-prec-sqrt=true``, ``-prec-div=true``). A
subnormal intermediate may be flushed to zero on the device (CuPy may compile with
``-ftz=true``) where the twin keeps it: there, and only there, the two may differ.

Each host scalar is rounded once to the parameters' dtype, as CuPy and NumPy round a Python
float met by a float32 array, so the twin and the kernel see the numbers the reference sees.
S6 ORs 1 into ``flag[0]`` when an updated entry (``w``, ``m`` or ``v``) is not finite, S7
ORs 2 when an entry of ``w`` changed (``w_new != w``, as ``array_equal`` tells them apart:
a NaN counts as changed): integer ORs (``atomicOr`` on the device, order-free, so the run
stays deterministic; S7 looks at the flag first, so most threads skip the atomic), read
once per optimiser step for every parameter together (:meth:`refimpl.optim.Adam.step`), or
with a training step's checks (:func:`refimpl.train.guards.checked_step`: no 2 is "the
optimiser froze").
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import backend_name

__all__ = [
    "ADAM_OPERATION", "GROUP", "AdamScalars", "adam_twin", "cuda_source", "cuda_sources",
    "fused_adam_step",
]  # fmt: skip


class AdamScalars(NamedTuple):
    """One step's host scalars (:class:`refimpl.optim.Adam`), the same for every parameter.

    Attributes
    ----------
    decay : float
        ``weight_decay``.
    lerp_weight : float
        ``1 - beta1``, ATen's lerp weight.
    lerp_rest : float
        ``1 - (1 - beta1)``, its other branch's factor.
    beta2 : float
        ``beta2``.
    rest2 : float
        ``1 - beta2``.
    bias2_sqrt : float
        ``sqrt(1 - beta2^t)``.
    eps : float
        ``eps``.
    neg_step : float
        ``-lr / (1 - beta1^t)``.
    decayed : bool
        ``weight_decay != 0``.
    near_start : bool
        ``|1 - beta1| < 0.5``: lerp's first branch.
    """

    decay: float
    lerp_weight: float
    lerp_rest: float
    beta2: float
    rest2: float
    bias2_sqrt: float
    eps: float
    neg_step: float
    decayed: bool
    near_start: bool


ADAM_OPERATION = """
T g = grad;
if (decayed) g = g + decay * w;                                  // S1 L2 decay, coupled
if (near_start) m = m_prev + lerp_weight * (g - m_prev);         // S2 ATen's lerp
else m = g - (g - m_prev) * lerp_rest;
v = v_prev * beta2 + (rest2 * g) * g;                            // S3 mul_, addcmul_
T denom = sqrt(v) / bias2_sqrt + eps;                            // S4
w_new = w + (neg_step * m) / denom;                              // S5 addcdiv_
if (!(isfinite(w_new) && isfinite(m) && isfinite(v))) atomicOr(&flag[0], 1);  // S6
if (w_new != w && (flag[0] & 2) == 0) atomicOr(&flag[0], 2);                    // S7
"""
ADAM_OPTIONS = ("--fmad=false",)  # no contraction into multiply-adds: bitwise with the twin
BLOCK = 256  # threads per block
GROUP = 48  # parameters per launch: 64 bytes of arguments each, well inside 4 KiB

_C_TYPES = {"float32": "float", "float64": "double"}
# the step's scalars as the kernel takes them: AdamScalars' fields, then the flag
_SCALAR_PARAMS = (
    "const T decay, const T lerp_weight, const T lerp_rest, const T beta2, const T rest2, "
    "const T bias2_sqrt, const T eps, const T neg_step, const int decayed, const int near_start, "
    "int* flag"
)
_SCALAR_NAMES = (
    "decay, lerp_weight, lerp_rest, beta2, rest2, bias2_sqrt, eps, neg_step, decayed, "
    "near_start, flag"
)


@functools.cache
def cuda_source(c_type: str, count: int) -> str:
    """The kernel ``refimpl_adam`` for ``count`` parameters of C type ``c_type`` (``"float"``
    or ``"double"``): the step's scalars and the flag, then per parameter ``k`` its pointers
    ``w``, ``grad``, ``m_prev``, ``v_prev``, ``w_new``, ``m``, ``v`` and its size."""
    params = [
        f"const T* w{k}, const T* grad{k}, const T* m_prev{k}, const T* v_prev{k}, "
        f"T* w_new{k}, T* m{k}, T* v{k}, const long long n{k}"
        for k in range(count)
    ]
    body = []
    for k in range(count):  # F1 the parameter that holds entry i
        body.append(
            f"if (i < n{k}) {{ refimpl_adam_entry(w{k}[i], grad{k}[i], m_prev{k}[i], "
            f"v_prev{k}[i], {_SCALAR_NAMES}, w_new{k}[i], m{k}[i], v{k}[i]); return; }}"
        )
        body.append(f"i -= n{k};")
    return (
        f"typedef {c_type} T;\n"
        "__device__ __forceinline__ void refimpl_adam_entry(\n"
        f"    const T w, const T grad, const T m_prev, const T v_prev, {_SCALAR_PARAMS},\n"
        "    T& w_new, T& m, T& v) {"
        + ADAM_OPERATION
        + "}\n"
        + f'extern "C" __global__ void refimpl_adam({_SCALAR_PARAMS}, {", ".join(params)}) {{\n'
        + "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n    "
        + "\n    ".join(body[:-1])  # nothing follows the last parameter's test
        + "\n}\n"
    )


def cuda_sources() -> dict[str, str]:
    """The kernel for three parameters, once for float and once for double, by name."""
    return {f"adam_{c_type}": cuda_source(c_type, 3) for c_type in ("float", "double")}


def adam_twin(
    ws: list[np.ndarray],
    grads: list[np.ndarray],
    m_prevs: list[np.ndarray],
    v_prevs: list[np.ndarray],
    *scalars: Any,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """The kernel on NumPy: per parameter in order (F1), :data:`ADAM_OPERATION` in its order
    (``S1`` ... ``S7``) on every entry.

    Parameters
    ----------
    ws : list of numpy.ndarray
        The parameters, float32 or float64, all of one dtype.
    grads : list of numpy.ndarray
        Their gradients, each of its parameter's shape and dtype.
    m_prevs : list of numpy.ndarray
        The first moments before the step, likewise.
    v_prevs : list of numpy.ndarray
        The second moments before the step, likewise.
    *scalars : Any
        :class:`AdamScalars`' fields in order, then ``flag``, ``(1,)`` int32: OR-ed in place
        with 1 when an updated entry is not finite, with 2 when an entry of a parameter changed.

    Returns
    -------
    tuple of list of numpy.ndarray
        ``(w_news, ms, vs)``, new arrays, each of its parameter's shape and dtype.
    """
    *values, flag = scalars
    s = AdamScalars(*values)
    w_news, ms, vs = [], [], []
    for w, grad, m_prev, v_prev in zip(ws, grads, m_prevs, v_prevs, strict=True):  # F1
        t = w.dtype.type  # each host scalar rounded once to the parameters' dtype (T)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow: S6's flag
            g = grad + t(s.decay) * w if s.decayed else grad  # S1
            if s.near_start:  # S2
                m = m_prev + t(s.lerp_weight) * (g - m_prev)
            else:
                m = g - (g - m_prev) * t(s.lerp_rest)
            v = v_prev * t(s.beta2) + (t(s.rest2) * g) * g  # S3
            denom = np.sqrt(v) / t(s.bias2_sqrt) + t(s.eps)  # S4
            w_new = w + (t(s.neg_step) * m) / denom  # S5
        if not (np.isfinite(w_new).all() and np.isfinite(m).all() and np.isfinite(v).all()):
            flag[0] |= 1  # S6
        if (w_new != w).any():
            flag[0] |= 2  # S7
        w_news.append(np.asarray(w_new))  # 0-d stays an array
        ms.append(np.asarray(m))
        vs.append(np.asarray(v))
    return w_news, ms, vs


@functools.cache
def _kernel(c_type: str, count: int) -> Any:
    import cupy

    module = cupy.RawModule(code=cuda_source(c_type, count), options=ADAM_OPTIONS)
    return module.get_function("refimpl_adam")


def fused_adam_step(
    xp: Any,
    ws: list[Any],
    grads: list[Any],
    m_prevs: list[Any],
    v_prevs: list[Any],
    scalars: AdamScalars,
    flag: Any,
) -> tuple[list[Any], list[Any], list[Any]]:
    """Every parameter's ``(w_new, m, v)`` on a device backend, in one launch per dtype (and
    per :data:`GROUP` parameters): the kernel of :func:`cuda_source` on CuPy, :func:`adam_twin`
    on the strict stand-in.

    Parameters
    ----------
    xp : module
        The arrays' module: ``cupy`` or the strict stand-in (``ValueError`` for NumPy).
    ws : list of array
        The parameters, each float32 or float64.
    grads : list of array
        Their gradients, each of its parameter's shape and dtype.
    m_prevs : list of array
        The first moments before the step, likewise.
    v_prevs : list of array
        The second moments before the step, likewise.
    scalars : AdamScalars
        The step's host scalars.
    flag : array
        ``(1,)`` int32 on that backend, OR-ed with 1 when an updated entry is not finite,
        with 2 when an entry of a parameter changed.

    Returns
    -------
    tuple of list of array
        ``(w_news, ms, vs)``, new arrays, each of its parameter's shape and dtype, in the
        order of ``ws``.
    """
    name = backend_name(xp)
    if name not in ("cupy", "strict"):
        raise ValueError(f"the fused Adam update runs on a device backend, not {name!r}")
    groups: dict[str, list[int]] = {}  # the parameters by dtype, in order
    for k, w in enumerate(ws):
        if w.dtype.name not in _C_TYPES:
            raise TypeError(
                f"the fused Adam update takes float32 or float64 parameters, got {w.dtype} "
                f"(parameter {k}); cast the model's parameters, or train on NumPy"
            )
        groups.setdefault(w.dtype.name, []).append(k)
    out: list[list[Any]] = [[None] * len(ws) for _ in range(3)]
    for dtype_name, members in groups.items():
        for first in range(0, len(members), GROUP):
            ks = members[first : first + GROUP]
            picked = [[arrays[k] for k in ks] for arrays in (ws, grads, m_prevs, v_prevs)]
            if name == "strict":
                results = xp.run_kernel(adam_twin, *picked, *scalars, flag)
            else:
                results = _launch(xp, _C_TYPES[dtype_name], picked, scalars, flag)
            for slot, arrays in zip(out, results, strict=True):
                for k, array in zip(ks, arrays, strict=True):
                    slot[k] = array
    return out[0], out[1], out[2]


def _launch(
    xp: Any, c_type: str, picked: list[list[Any]], scalars: AdamScalars, flag: Any
) -> tuple[list[Any], list[Any], list[Any]]:
    """One launch of the kernel on CuPy over the parameters ``picked`` (w, grad, m, v lists)."""
    t = picked[0][0].dtype.type  # each host scalar rounded once to T
    host = [t(value) for value in scalars[:8]] + [np.int32(switch) for switch in scalars[8:]]
    inputs = [[xp.ascontiguousarray(a) for a in arrays] for arrays in picked]
    w_news, ms, vs = ([xp.empty_like(w) for w in inputs[0]] for _ in range(3))
    arguments = []
    for k, w in enumerate(inputs[0]):
        arguments += [w, inputs[1][k], inputs[2][k], inputs[3][k], w_news[k], ms[k], vs[k]]
        arguments.append(np.int64(w.size))
    total = sum(w.size for w in inputs[0])
    kernel = _kernel(c_type, len(inputs[0]))
    kernel((max(1, -(-total // BLOCK)),), (BLOCK,), (*host, flag, *arguments))
    return w_news, ms, vs
