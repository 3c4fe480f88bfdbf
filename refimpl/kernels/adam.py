"""Adam's update of one parameter as one fused device kernel, beside its NumPy twin.

:class:`refimpl.optim.Adam` performs the operations of PyTorch's ``_single_tensor_adam`` one
array at a time, a device launch each (15 per parameter). :data:`ADAM_OPERATION` performs the
same operations, in the same order and in the parameter's dtype, on each entry in one
``cupy.ElementwiseKernel``; :func:`adam_twin` is its NumPy twin, written step for step in
the kernel's order (``S1`` ... ``S7``), which the strict stand-in runs as the one launch the
kernel is (:func:`refimpl.testing.strict.run_kernel`); :func:`cuda_sources` writes it out as
the CUDA kernel CuPy makes of it, for ``nvcc`` (the PTX tests). ``tests/test_optim.py`` holds the
twin bitwise equal to the reference update on NumPy (both branches of ATen's ``lerp``, with
and without weight decay, float32 and float64).

Bitwise, and where not: the kernel is compiled with ``--fmad=false``, so no product is
contracted into a multiply-add (the reference rounds every product); square root and
division are IEEE-rounded (NVRTC's defaults ``-prec-sqrt=true``, ``-prec-div=true``). A
subnormal intermediate may be flushed to zero on the device (CuPy may compile with
``-ftz=true``) where the twin keeps it: there, and only there, the two may differ.

Each host scalar is rounded once to the parameter's dtype, as CuPy and NumPy round a Python
float met by a float32 array, so the twin and the kernel see the numbers the reference sees.
S6 ORs 1 into ``flag[0]`` when an updated entry (``w``, ``m`` or ``v``) is not finite, S7
ORs 2 when an entry of ``w`` changed (``w_new != w``, as ``array_equal`` tells them apart:
a NaN counts as changed): integer ORs (``atomicOr`` on the device, order-free, so the run
stays deterministic; S7 looks at the flag first, so most threads of a changing parameter
skip the atomic), read once per optimiser step for every parameter together
(:meth:`refimpl.optim.Adam.step`), or with a training step's checks
(:func:`refimpl.train.guards.checked_step`: no 2 is "the optimiser froze").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refimpl.backend import backend_name

__all__ = ["ADAM_OPERATION", "AdamScalars", "adam_twin", "cuda_sources", "fused_adam_update"]


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


ADAM_IN_PARAMS = (
    "T w, T grad, T m_prev, T v_prev, T decay, T lerp_weight, T lerp_rest, T beta2, T rest2, "
    "T bias2_sqrt, T eps, T neg_step, bool decayed, bool near_start, raw int32 flag"
)
ADAM_OUT_PARAMS = "T w_new, T m, T v"
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

_kernels: dict[str, Any] = {}  # the compiled CuPy kernel, made at first use


def cuda_sources() -> dict[str, str]:
    """:data:`ADAM_OPERATION` as the CUDA kernel CuPy's ``ElementwiseKernel`` makes of it,
    once for float and once for double, by name: one thread per entry, ``T`` fixed, the inputs
    read into locals and the outputs written by reference."""
    sources = {}
    for c_type in ("float", "double"):
        params, body = [], []
        for spec in ADAM_IN_PARAMS.split(","):
            *kind, name = spec.split()
            if kind == ["raw", "int32"]:
                params.append(f"int* {name}")
            elif name in ("w", "grad", "m_prev", "v_prev"):
                params.append(f"const T* {name}_")
                body.append(f"const T {name} = {name}_[i];")
            else:
                params.append(f"{kind[0]} {name}")
        for spec in ADAM_OUT_PARAMS.split(","):
            name = spec.split()[1]
            params.append(f"T* {name}_")
            body.append(f"T& {name} = {name}_[i];")
        sources[f"adam_{c_type}"] = (
            f"typedef {c_type} T;\n"
            f'extern "C" __global__ void refimpl_adam({", ".join(params)}, int n) {{\n'
            "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i >= n) return;\n  "
            + "\n  ".join(body)
            + ADAM_OPERATION
            + "}\n"
        )
    return sources


def adam_twin(
    w: np.ndarray, grad: np.ndarray, m_prev: np.ndarray, v_prev: np.ndarray, *scalars: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:data:`ADAM_OPERATION` on NumPy, in its order (``S1`` ... ``S7``).

    Parameters
    ----------
    w : numpy.ndarray
        The parameter, float32 or float64.
    grad : numpy.ndarray
        Its gradient, of ``w``'s shape and dtype.
    m_prev : numpy.ndarray
        The first moment before the step, likewise.
    v_prev : numpy.ndarray
        The second moment before the step, likewise.
    *scalars : Any
        :class:`AdamScalars`' fields in order, then ``flag``, ``(1,)`` int32: OR-ed in place
        with 1 when an updated entry is not finite, with 2 when an entry of ``w`` changed.

    Returns
    -------
    tuple of numpy.ndarray
        ``(w_new, m, v)``, new arrays of ``w``'s shape and dtype.
    """
    *values, flag = scalars
    s = AdamScalars(*values)
    t = w.dtype.type  # each host scalar rounded once to the parameter's dtype (T)
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
    return np.asarray(w_new), np.asarray(m), np.asarray(v)  # 0-d stays an array


def fused_adam_update(
    xp: Any, w: Any, grad: Any, m_prev: Any, v_prev: Any, scalars: AdamScalars, flag: Any
) -> tuple[Any, Any, Any]:
    """One parameter's ``(w_new, m, v)`` in one launch on a device backend: CuPy's
    ``ElementwiseKernel`` of :data:`ADAM_OPERATION`, or :func:`adam_twin` on the strict
    stand-in.

    Parameters
    ----------
    xp : module
        The arrays' module: ``cupy`` or the strict stand-in (``ValueError`` for NumPy).
    w : array
        The parameter, float32 or float64.
    grad : array
        Its gradient, of ``w``'s shape and dtype.
    m_prev : array
        The first moment before the step, likewise.
    v_prev : array
        The second moment before the step, likewise.
    scalars : AdamScalars
        The step's host scalars.
    flag : array
        ``(1,)`` int32 on that backend, OR-ed with 1 when an updated entry is not finite,
        with 2 when an entry of ``w`` changed.

    Returns
    -------
    tuple of array
        ``(w_new, m, v)``, new arrays of ``w``'s shape and dtype.
    """
    name = backend_name(xp)
    if name == "strict":
        return xp.run_kernel(adam_twin, w, grad, m_prev, v_prev, *scalars, flag)
    if name != "cupy":
        raise ValueError(f"the fused Adam update runs on a device backend, not {name!r}")
    kernel = _kernels.get("adam")
    if kernel is None:
        kernel = xp.ElementwiseKernel(
            ADAM_IN_PARAMS, ADAM_OUT_PARAMS, ADAM_OPERATION, "refimpl_adam", options=ADAM_OPTIONS
        )
        _kernels["adam"] = kernel
    return kernel(w, grad, m_prev, v_prev, *scalars, flag)
