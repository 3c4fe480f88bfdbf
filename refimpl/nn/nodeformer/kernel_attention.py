"""Kernelised all-pair attention of NodeFormer, O(N): softmax (Eq. 5) and Gumbel-Softmax (Eq. 7).

:class:`KernelizedSoftmax` states the equations (Eq. 5, 7, Alg. 1), its arguments and shapes;
this docstring how they are computed. Gumbel noise ``g (N, K)`` holds one value per *key*
node ``v`` and sample ``s``, shared by all queries (as the authors' code draws it). Without
``gumbel`` the forms are Eq. 2 and Eq. 5 (``K = 1``, ``g = 0``, bit for bit). The exact
``O(N^2)`` forms, the ground truth at small ``N``, are
:class:`~refimpl.nn.nodeformer.all_pair_softmax.AllPairSoftmax`;
the literal twin of this module, Eq. 7 written out with its backward, is
:mod:`refimpl.naive.kernel_attention`.

Stabilisation (``stabilize=True``), in the log domain
-----------------------------------------------------
With ``a(x)_i = w_i^T x - ||x||^2 / 2`` (:func:`feature_exponent`):

* query features ``exp(a(q_u) - max_i a(q_u)_i) / sqrt(m)``: a per-query factor,
  cancels in the ratio (``stabilizer="row"`` of :mod:`refimpl.nn.nodeformer.random_features`);
* per-sample key features ``K~[v, s, i] = exp((a(k_v)_i - r_v) + (r_v + g_vs / tau
  - c_s)) / sqrt(m)`` with ``r_v = max_i a(k_v)_i`` and ``c_s = max_v (r_v + g_vs /
  tau)``: Alg. 1 line 6's ``e^{g_vs/tau} phi(k_v)`` times one factor ``e^{-c_s}``
  common to all keys of sample ``s``, which cancels in that sample's ratio. Both
  bracketed terms are ``<= 0`` (nothing overflows) and each sample's largest key
  holds a feature ``1 / sqrt(m)``.
* the floor: exponents below ``cut = log(finfo.tiny) + 40`` give exact zeros
  instead of subnormal floats, which slow every product they enter on x86 (with
  Gumbel noise at ``tau = 0.25`` many float32 key weights fall there). A feature is
  ``exp(max(a, cut)) - e^cut`` (:func:`_exp_floored`): within
  ``e^cut`` (``2.8e-21`` in float32, ``5e-291`` in float64) of ``exp(a)``, against a
  ``1 / sqrt(m)`` in every sum it enters: a relative change below ``N m e^cut``.

Alg. 1 line 6 also multiplies the *query* features by ``G_k``: a per-query
factor that cancels in line 8, so it is left out. The backward holds every
shift constant, which is exact because the output does not depend on them (the
gradient of Eq. 5/7 in ``Q, K, V``, not of any stabilised intermediate).
``stabilize=False`` evaluates Eq. 4 and ``e^{g/tau}`` as printed (overflow-prone;
for tests that the stabiliser cancels).

Row blocks
----------
:class:`KernelizedSoftmax` never forms an ``(N, K m)`` array. Every step runs over blocks of
rows (:data:`ROW_BLOCK` = 1024 nodes on the host; on a device as many as keep a block within
``DEVICE_BLOCK_BYTES``, :func:`row_blocks`): a block's key features ``K~^T (K m, B)`` (1.2
MB in float32 at ``K m = 300``) are built, used in its products and dropped while they sit
in a core's cache, and the backward rebuilds them instead of reading them back from memory.
Per-node arrays are kept transposed, ``(m, N)`` and ``(K, N)``, so a block's broadcasts run
along the nodes: ``B`` contiguous values per row, not ``m = 30`` or ``K = 10``. The blocks
run on :func:`~refimpl.kernels.parallel.map_blocks`'s threads, with BLAS on one thread in
each. What the blocks share (``U_s``, ``O_s``, their gradients, the shift ``c_s``) is summed
or maximised over the blocks in block order, so results depend on the block size (by
rounding) but not on the thread count (bit for bit). The benchmark docs give the time this
saves.

Edge semantics
--------------
* ``N = 1``: one key, so its weight is 1 and ``Z = V`` up to rounding (``num / den``
  with ``num = den * v`` summed in another order).
* ``K = 1``: one sample, no averaging.
* Denominators: ``phi > 0`` so they are positive in exact arithmetic, and no
  ``eps`` is added (the authors add ``1e-6`` to every feature, which does not
  cancel). A denominator that underflows to 0 (features of ``q_u`` and of the
  keys peaking on different rows of ``omega`` at very large ``||q|| / sqrt(tau)``)
  or any non-finite one raises :class:`~refimpl.validation.NonFiniteError`. Inside a device
  training step (:func:`~refimpl.train.guards.deferred_step`) the check is queued for the
  step's one read instead (no sync); a bad denominator reruns the step checked, which raises.
* The random features are noise: ``omega`` and ``gumbel`` get no gradient.

Parity with the authors' ``kernelized_softmax`` / ``kernelized_gumbel_softmax``
(``nodeformer.py``): same ratios and sample layout (their noise is
``[N, B, H, K]``, drawn as ``-log(Exp(1))``); they add ``1e-6`` to every
feature, shift keys by ``max(omega x)`` without ``-||x||^2/2`` (a different
global constant, which cancels) and multiply by ``e^{g/tau}`` unshifted, and
their features carry NodeFormerConv's ``d^{-1/4}`` on ``q`` and ``k``, which a
caller applies before this block (``qk_scale="sqrt_d"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from refimpl.backend import get_array_module
from refimpl.fields import check_nonnegative_number
from refimpl.kernels.parallel import map_blocks, row_blocks, sum_in_order
from refimpl.nn.nodeformer.all_pair_softmax import check_attention_inputs
from refimpl.nn.nodeformer.kernel_attention_cache import KernelizedSoftmaxCache
from refimpl.nn.nodeformer.random_features import feature_exponent, feature_exponent_backward
from refimpl.ops.linear import with_ones
from refimpl.validation import NonFiniteError, all_finite, check_cotangent, finite_queues

__all__ = ["KernelizedSoftmax", "KernelizedSoftmaxCache"]


@dataclass(frozen=True)
class KernelizedSoftmax:
    r"""Kernelised softmax (NodeFormer Eq. (5)) and Gumbel-Softmax (Eq. (7), (17), Alg. 1).

    With $\phi$ of Eq. (4) on $\boldsymbol{\omega}$ $(m, d)$, Gumbel noise $g_{vs}$ per key
    $v$ and sample $s = 1..K$ (Eq. (5) is $K = 1$, $g = 0$), never forming $N \times N$:

    $$
    \mathbf{z}_u = \frac{1}{K} \sum_{s=1}^{K}
    \frac{\phi(\mathbf{q}_u / \sqrt{\tau})^\top \sum_v e^{g_{vs} / \tau}
    \phi(\mathbf{k}_v / \sqrt{\tau}) \mathbf{v}_v^\top}
    {\phi(\mathbf{q}_u / \sqrt{\tau})^\top \sum_w e^{g_{ws} / \tau}
    \phi(\mathbf{k}_w / \sqrt{\tau})}
    $$

    so $\phi(\mathbf{q}/\sqrt{\tau})^\top \phi(\mathbf{k}/\sqrt{\tau})$ estimates
    $\exp(\mathbf{q}^\top \mathbf{k} / \tau)$ (Prop. 1): each sample is normalised on its
    own and the $K$ results averaged (Alg. 1 line 8). $O(N K m (d + d_v))$ time, $O(N (m +
    K))$ memory beyond inputs and outputs (row blocks, module docstring). Stabilisation,
    what cancels, the floor, $N = 1$ and zero denominators: module docstring.

    Parameters
    ----------
    tau : float, default 1.0
        $\tau > 0$, the temperature; 1 is Eq. (5) as printed (the authors' code: 0.25).
    stabilize : bool, default True
        Log-domain shifts that cancel in the ratio; False evaluates Eq. (4) as printed.

    Shapes
    ------
    - **input**: ``q``, ``k`` $(N, d)$; ``v`` $(N, d_v)$; ``omega`` $(m, d)$; ``gumbel``
      $(N, K)$ or None (noise: no gradient; ``q``'s dtype and backend)
    - **output**: ``z`` $(N, d_v)$
    - **backward**: ``d_z`` $(N, d_v)$; returns ``((d_q, d_k, d_v), {})``
    """

    tau: float = 1.0  # temperature; 1 is Eq. 5 as printed (the authors' code defaults to 0.25)
    stabilize: bool = True  # log-domain shifts that cancel in the ratio; False: Eq. 4 as printed

    def __post_init__(self) -> None:
        check_nonnegative_number(self.tau, "KernelizedSoftmax tau", allow_zero=False)
        if not isinstance(self.stabilize, bool):
            raise ValueError(f"KernelizedSoftmax stabilize must be a bool, got {self.stabilize!r}")

    def forward(
        self, params: dict[str, Any], q: Any, k: Any, v: Any, omega: Any, gumbel: Any = None
    ) -> tuple[Any, KernelizedSoftmaxCache]:
        """``Z``: q, k (N, d), v (N, d_v), omega (m, d), gumbel (N, K) or None -> (N, d_v)."""
        check_attention_inputs("KernelizedSoftmax", params, q, k, v, gumbel, omega)
        return self.forward_unchecked(q, k, v, omega, gumbel)

    def forward_unchecked(
        self, q: Any, k: Any, v: Any, omega: Any, gumbel: Any, out: Any = None
    ) -> tuple[Any, KernelizedSoftmaxCache]:
        """:meth:`forward` without the input checks, for callers that made the inputs; ``z``
        is written into ``out`` (N, d_v) when given (a head of the caller's array)."""
        xp = get_array_module(q)
        (n, _), m, dtype = q.shape, omega.shape[0], q.dtype
        samples = 1 if gumbel is None else gumbel.shape[1]
        scale = 1.0 / math.sqrt(self.tau)
        log_sqrt_m = 0.5 * math.log(m)  # Eq. 4's 1 / sqrt(m), in the log domain
        floor = _floor(xp, dtype) if self.stabilize else None
        blocks = row_blocks(xp, n, ROW_BLOCK, block_row_bytes(samples, m, dtype))
        query_features = xp.empty((m, n), dtype=dtype)
        key_exponents = xp.empty((m, n), dtype=dtype)
        log_weights = xp.empty((samples, n), dtype=dtype)

        def node_block(j: int) -> Any:
            rows = blocks[j]
            # F1-F2 exponents of Eq. 4 at q / sqrt(tau), k / sqrt(tau) (Eq. 6-7, Alg. 1
            #    line 6)  (m, B)
            a_q = feature_exponent(q[rows], omega, scale, transposed=True)
            a_k = feature_exponent(k[rows], omega, scale, transposed=True)
            # F3 the Gumbel log-weights g / tau (Alg. 1 line 4, in the log domain)  (K, B)
            if gumbel is None:
                weights = xp.zeros((1, a_k.shape[1]), dtype=dtype)
            else:
                weights = gumbel[rows].T / self.tau
            if floor is None:  # F4-F5 as printed: phi of Eq. 4 and e^{g / tau}, unshifted
                query_features[:, rows] = xp.exp(a_q - log_sqrt_m)
                key_exponents[:, rows] = a_k - log_sqrt_m
                log_weights[:, rows] = weights
                return None
            # F4 query features, per-query shift (cancels in line 8)
            a_q -= xp.max(a_q, axis=0) + log_sqrt_m
            query_features[:, rows] = _exp_floored(a_q, floor)
            # F5 key v's features in sample s are exp(log_weights[s, v] + key_exponents[:, v]):
            #    the per-key shift r_v enters both terms with opposite signs (Alg. 1 lines 5-6)
            r = xp.max(a_k, axis=0)  # (B,)
            key_exponents[:, rows] = a_k - r
            log_weights[:, rows] = weights + r
            return xp.max(log_weights[:, rows], axis=1)  # (K,) this block's largest per sample

        maxima = map_blocks(node_block, len(blocks))
        if floor is not None:
            # F6 per-sample shift c_s (and Eq. 4's 1 / sqrt(m)), common to all keys of s
            shift = xp.max(xp.stack(maxima), axis=0) + log_sqrt_m  # (K,)
            log_weights -= shift[:, None]

        # F7 per row block, its key features (K m, B), sample-major rows (Alg. 1 line 6);
        # F8 U_s = K~_s^T V for all s at once, (K m, B) @ (B, d_v), and O_s = K~_s^T 1,
        #    summed over the blocks in order (Alg. 1 line 7)
        def key_block(j: int) -> Any:
            rows = blocks[j]
            keys = key_features(log_weights, key_exponents, rows, floor)  # (K m, B)
            return keys @ with_ones(v[rows])  # (K m, B) @ (B, d_v + 1): [U | O]

        # (K m, d_v + 1) summed over the blocks in order
        kv_and_sum = sum_in_order(map_blocks(key_block, len(blocks)))
        kv = xp.ascontiguousarray(kv_and_sum[:, :-1])  # (K m, d_v)
        k_sum = kv_and_sum[:, -1].reshape(samples, m)  # (K, m)
        denominators = xp.empty((samples, n), dtype=dtype)
        coefficients = xp.empty((samples, n), dtype=dtype)
        z = xp.empty((n, v.shape[1]), dtype=dtype) if out is None else out
        # a device training step defers its checks to one read at its end (finite_queues)
        deferred = xp is not np and bool(finite_queues())

        def output_block(j: int) -> bool:
            rows = blocks[j]
            features = _columns(query_features, rows)  # (m, B)
            # F9 denominators O_s phi_q: (K, m) @ (m, B) -> (K, B)  (line 8)
            denominators[:, rows] = den = k_sum @ features
            if not deferred and not bool(xp.all(xp.isfinite(den) & (den > 0))):
                return False
            # F10 Z_u = sum_s phi_q[u] U_s / (K den_su): normalise each sample, average (line
            #     8); one product over the stacked samples, (B, K m) @ (K m, d_v) -> (B, d_v)
            coefficients[:, rows] = coef = 1.0 / (samples * den)  # (K, B)
            xp.matmul(_mixing(coef, features).T, kv, out=z[rows])
            return True

        if not all(map_blocks(output_block, len(blocks))):
            raise NonFiniteError(_denominator_message(self, denominators))
        if deferred:
            # F9's check queued, not read (no sync): log(den) is finite exactly where den is
            # finite and > 0; a bad one reruns the step checked, which raises the error above
            all_finite(xp.log(denominators))
        cache = KernelizedSoftmaxCache(
            q,
            k,
            v,
            omega,
            query_features,
            key_exponents,
            log_weights,
            kv,
            k_sum,
            denominators,
            coefficients,
        )
        return z, cache

    def backward(
        self, params: dict[str, Any], cache: KernelizedSoftmaxCache, d_z: Any
    ) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
        """Gradients of ``<d_z, z>``: ``((d_q (N, d), d_k (N, d), d_v (N, d_v)), {})``."""
        check_cotangent(d_z, cache.v.shape, cache.v.dtype, cache.v, name="d_z")
        return self.backward_unchecked(cache, d_z), {}

    def backward_unchecked(self, cache: KernelizedSoftmaxCache, d_z: Any, out: Any = None) -> tuple:
        """:meth:`backward`'s ``(d_q, d_k, d_v)`` without the check, written into ``out``
        (three arrays shaped as ``q, k, v``: heads of the caller's arrays) when given."""
        q, k, v, omega, kv, k_sum = cache.q, cache.k, cache.v, cache.omega, cache.kv, cache.k_sum
        xp = get_array_module(d_z, v)
        n, (samples, m) = v.shape[0], k_sum.shape
        scale = 1.0 / math.sqrt(self.tau)
        floor = _floor(xp, v.dtype) if self.stabilize else None
        blocks = row_blocks(xp, n, ROW_BLOCK, block_row_bytes(samples, m, v.dtype))
        if out is None:
            out = (xp.empty_like(q), xp.empty_like(k), xp.empty_like(v))
        d_q, d_k, d_v = out

        def query_block(j: int) -> tuple[Any, Any]:
            rows = blocks[j]
            d_z_rows = d_z[rows]  # (B, d_v)
            features = _columns(cache.query_features, rows)  # (m, B)
            coef = _columns(cache.coefficients, rows)  # (K, B)
            # B10 (of F10) z = P kv with P[u, (s, i)] = coef_su phi_q[i, u]: d_kv = P^T d_z
            #     (summed over the blocks), d_P = d_z kv^T contracted with each factor
            d_kv = _mixing(coef, features) @ d_z_rows  # (K m, B) @ (B, d_v)
            d_mixing = (kv @ d_z_rows.T).reshape(samples, m, -1)  # (K, m, B)
            d_features = xp.einsum("smb,sb->mb", d_mixing, coef)  # (m, B)
            d_coef = xp.einsum("smb,mb->sb", d_mixing, features)  # (K, B)
            # coef = 1 / (K den): d coef / d den = -coef / den
            d_den = -d_coef * coef / cache.denominators[:, rows]  # (K, B)
            # B9 (of F9) den = O phi_q: (m, K) @ (K, B); (K, B) @ (B, m), summed over blocks
            d_features += k_sum.T @ d_den
            d_k_sum = d_den @ features.T  # (K, m)
            # B4 (of F4) the features are exp(exponent - shift), the shift held: d a = d_phi phi
            # B2-B1 (of F2-F1) through Eq. 4's exponent at q / sqrt(tau)  (B, d)
            d_features *= features
            feature_exponent_backward(q[rows], omega, d_features.T, scale, out=d_q[rows])
            return d_kv, d_k_sum

        partial = map_blocks(query_block, len(blocks))
        d_kv = sum_in_order([p[0] for p in partial])  # (K m, d_v)
        d_k_sum = sum_in_order([p[1] for p in partial]).reshape(samples * m, 1)
        d_kv_and_sum = xp.concatenate([d_kv, d_k_sum], axis=1)  # (K m, d_v + 1): [d_U | d_O]

        def key_block(j: int) -> None:
            rows = blocks[j]
            keys = key_features(cache.log_weights, cache.key_exponents, rows, floor)  # (K m, B)
            # B8 (of F8) d_V = K~ d_U; d_K~ = d_U V^T + d_O 1^T = [d_U | d_O] [V | 1]^T
            xp.matmul(keys.T, d_kv, out=d_v[rows])  # (B, K m) @ (K m, d_v)
            d_keys = d_kv_and_sum @ with_ones(v[rows]).T  # (K m, d_v + 1) @ (d_v + 1, B)
            # B7 (of F7) the features are exp(exponent): d exponent = d_K~ K~, summed over the
            #    samples for the key exponents; nothing flows into g (noise) or into the shifts
            #    r_v, c_s: each is held, which is exact because Z does not depend on them
            d_exponents = xp.einsum(
                "smb,smb->mb", d_keys.reshape(samples, m, -1), keys.reshape(samples, m, -1)
            )  # (m, B)
            # B2-B1 (of F2-F1) through Eq. 4's exponent at k / sqrt(tau)  (B, d)
            feature_exponent_backward(k[rows], omega, d_exponents.T, scale, out=d_k[rows])

        map_blocks(key_block, len(blocks))
        return d_q, d_k, d_v

    @staticmethod
    def sample_outputs(cache: KernelizedSoftmaxCache) -> Any:
        """Each sample's normalised output before the average (Eq. 7's ratio per ``s``):
        ``phi_q U_s / den_s``, ``(K, N, d_v)``; ``z`` is their mean."""
        samples, m = cache.k_sum.shape
        kv = cache.kv.reshape(samples, m, -1)  # (K, m, d_v)
        return (cache.query_features.T @ kv) / cache.denominators[:, :, None]


ROW_BLOCK = 1024  # host rows per block: (K m, B) = (300, 1024) float32 is 1.2 MB, in L2


def block_row_bytes(samples: int, m: int, dtype: Any) -> int:
    """Bytes a row adds to a block's intermediates on a device (:func:`row_blocks`): the
    backward's key block holds four ``(K m, B)`` arrays at once (the exponents, the key
    features, their gradient and its product with them)."""
    return 4 * samples * m * dtype.itemsize


def key_features(log_weights: Any, key_exponents: Any, rows: slice, floor: Any) -> Any:
    """``K~^T`` of a block of keys, ``(K m, B)``: ``[(s, i), v] = exp(log_weights[s, v] +
    key_exponents[i, v])`` (Alg. 1 line 6), floored as :func:`_exp_floored` (None: as is)."""
    weights, exponents = _columns(log_weights, rows), _columns(key_exponents, rows)
    exponent = weights[:, None, :] + exponents[None, :, :]  # (K, m, B)
    samples, m, width = exponent.shape
    return _exp_floored(exponent, floor).reshape(samples * m, width)


def _mixing(coefficients: Any, query_features: Any) -> Any:
    """``P^T (K m, B)`` of a block of queries, ``P[u, (s, i)] = coef[s, u] phi_q[i, u]``:
    F10's query side, from ``coefficients (K, B)`` and ``query_features (m, B)``."""
    # one product per entry, broadcast along the B contiguous queries (einsum's outer
    # product is slower)
    mixing = coefficients[:, None, :] * query_features[None, :, :]  # (K, m, B)
    samples, m, width = mixing.shape
    return mixing.reshape(samples * m, width)


def _columns(array: Any, rows: slice) -> Any:
    """``array[:, rows]`` of a transposed per-node array ``(c, N)``, as a compact ``(c, B)``
    copy: the broadcasts over it then run on one contiguous block, not on strided
    slices (worth the copy: see the benchmark docs)."""
    return get_array_module(array).ascontiguousarray(array[:, rows])


def _floor(xp: Any, dtype: Any) -> tuple[float, Any]:
    """``(cut, e^cut)``, ``cut = log(tiny) + 40`` of ``dtype``, ``e^cut`` as ``xp.exp`` gives
    it (so that subtracting it leaves exact zeros)."""
    cut = math.log(float(xp.finfo(dtype).tiny)) + 40.0
    return cut, xp.exp(xp.full((1,), cut, dtype=dtype))


def _exp_floored(exponent: Any, floor: Any) -> Any:
    """``exp(max(exponent, cut)) - e^cut`` (in place): ``exp(exponent)`` with exact zeros
    where it would fall below ``e^cut = tiny * e^40``; ``floor = None``: ``exp`` as is.

    Subnormal floats (below ``finfo.tiny``: ``1.2e-38`` in float32) make every product
    they enter slower on x86; with Gumbel noise at ``tau = 0.25`` many key weights land
    there in float32. Clamping the exponent first keeps ``exp`` off them in one pass (a
    masked assignment needs a mask and a scattered write). Every nonzero result is
    at least about ``e^cut eps`` (``tiny * e^24`` in float32), so products with factors
    down to ``e^-24`` stay normal. Each result is within ``e^cut`` (``2.8e-21`` in
    float32, ``5e-291`` in float64) of ``exp(exponent)``, while every row of the query
    features and every sample's keys hold a ``1 / sqrt(m)``: the sums they enter change
    by at most ``N m e^cut`` relative, far below float32's ``6e-8``.
    """
    xp = get_array_module(exponent)
    if floor is None:
        return xp.exp(exponent, out=exponent)
    cut, floor_value = floor
    if xp is np:  # a row of cuts: NumPy's maximum against a scalar is slower (benchmark docs)
        cut = np.full(exponent.shape[-1], cut, dtype=exponent.dtype)
    xp.maximum(exponent, cut, out=exponent)
    xp.exp(exponent, out=exponent)
    return xp.subtract(exponent, floor_value, out=exponent)


def _denominator_message(block: KernelizedSoftmax, denominators: Any) -> str:
    xp = get_array_module(denominators)
    bad = int(xp.sum(~(xp.isfinite(denominators) & (denominators > 0))))
    where = f"{bad} of {denominators.size} (sample, query) denominators"
    if not block.stabilize:
        return (
            f"KernelizedSoftmax: {where} of Eq. 5/7 over- or underflowed with stabilize=False "
            "(exp(w^T x) and e^(g/tau) evaluated as printed); use stabilize=True"
        )
    return (
        f"KernelizedSoftmax: {where} of Eq. 5/7 are 0 or not finite: ||q|| / sqrt(tau) or "
        f"||k|| / sqrt(tau) is too large (tau = {block.tau}) for the random features to "
        "resolve; scale q and k down, raise tau, or draw more features"
    )
