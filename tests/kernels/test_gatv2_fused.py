"""The fused GATv2 kernels' twin (:mod:`refimpl.kernels.gatv2_fused_twin`) against the literal path.

The twin runs the kernels' loops thread by thread in NumPy; the literal path is
:class:`refimpl.nn.gat.conv.GATConv` (version ``"v2"``, no LipschitzNorm, no edge features)
on the strict stand-in, which takes the device's code path, and on NumPy. The kernels
compute the score as ``sum_c att LeakyReLU(pre)`` channel by channel, the literal layer as
``(1 - s) att . relu(pre) + s (g_u + g_v)`` by BLAS products, and ``M`` as ``S(d_e f)``
against the literal ``(1 - s) S(d_e [pre > 0]) + s S(d_e)``: the same sums rounded
otherwise, so neither side is bitwise the other. The bound, stated once here
(:func:`magnitudes`) and used by the layer's tests too: every entry within ``FORWARD_RTOL``
of the size of the terms it is made of, entry by entry:

- a score ``e`` of ``K sum_c |att| (|h_src[u]| + |h_dst[v]|)`` (``K = max(1, s) + |1 - s| +
  s``: the LeakyReLU's factor and the literal split's), whose row maximum ``R`` (times 2:
  the entry's own score and the denominator's) bounds ``alpha``'s relative difference,
  ``rtol alpha (1 + 2 R)``; the aggregation ``sum_j |h_src| kept_j`` times the same;
- ``d_e = alpha (g - sum alpha g)`` of ``alpha (|g| + sum alpha |g|) (2 + 2 R)`` (its own
  roundings and alpha's), ``M`` of ``K sum |d_e|`` terms, ``d h = M att`` and ``d att = sum
  h M`` of their absolute terms.
A wrong derivative is wrong at the rounding-free level: only entries that are themselves
rounding (a row whose terms cancel) escape, as they must.
"""

from __future__ import annotations

import functools
import shutil
import sys
import types

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import asarray, backend_name, get_array_module, to_numpy
from refimpl.graph import Graph
from refimpl.kernels import gatv2_fused
from refimpl.kernels import gatv2_fused_twin as twin
from refimpl.nn.gat.conv import GATConv
from refimpl.testing.strategies import graphs, seeds
from refimpl.testing.tolerances import FORWARD_RTOL
from tests.kernels.test_gat_fused import EMPTY, LOOPS_AND_DUPLICATES, ONE_NODE, THREE_LOOPS
from tests.kernels.test_gat_fused_source import C_TYPES, CompiledSource, FakeRawModule, csr

BACKENDS = ["strict", "numpy"]
DTYPES = [np.float32, np.float64]


def layer_and_inputs(graph, heads, channels, dropout, slope, share, dtype, seed, backend,
                     kink=False):  # fmt: skip
    """``(layer, params, x, mask)`` on ``backend``; ``mask`` (E, H) over the attended edges
    (None without dropout). ``kink``: ``W_t = -W_s`` (not shared), so every self-loop's
    ``pre = W_s x_u - W_s x_u`` is exactly 0 in every channel, the LeakyReLU's kink."""
    layer = GATConv(3, channels, heads=heads, version="v2", share_weights=share,
                    dropout=dropout, negative_slope=slope, add_self_loops=False,
                    bias=False)  # fmt: skip
    rng = np.random.default_rng(seed)
    params = layer.init_params(rng, backend=backend, dtype=dtype)
    if kink:
        params["W_t"] = -params["W_s"]
    x = asarray(rng.standard_normal((graph.num_nodes, 3)) * 2, backend=backend, dtype=dtype)
    mask = None
    if dropout > 0:
        mask = asarray(rng.random((graph.num_edges, heads)) >= dropout, backend=backend)
    return layer, params, x, mask


def literal_forward(*case, kink=False):
    """The literal layer's training forward: ``(layer, params, x, out, cache)``."""
    graph = case[0]
    layer, params, x, mask = layer_and_inputs(*case, kink=kink)
    out, cache = layer.forward(params, x, graph, training=True, attn_dropout_mask=mask)
    return layer, params, x, out, cache


def twin_inputs(layer, params, cache, xp) -> dict:
    """What the kernels read, from the literal forward's cache, on the host (one array for
    ``h_src`` and ``h_dst`` where the layer has one)."""
    src, dst = cache.graph.src_segments(xp), cache.graph.dst_segments(xp)
    h_src = to_numpy(cache.h_src)
    return {
        "h_src": h_src,
        "h_dst": h_src if cache.h_dst is cache.h_src else to_numpy(cache.h_dst),
        "att": to_numpy(params["att"]),
        "src": to_numpy(src.index),
        "dst": to_numpy(dst.index),
        "dst_csr": tuple(to_numpy(a) for a in dst.csr_structure()),
        "src_csr": tuple(to_numpy(a) for a in src.csr_structure()),
        "keep": None if cache.dropout_cache.mask is None else to_numpy(cache.dropout_cache.mask),
        "scale": 1.0 / (1.0 - layer.dropout),
        "slope": layer.negative_slope,
    }


def twin_forward(inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    return twin.forward(
        inputs["h_src"], inputs["h_dst"], inputs["att"], inputs["src"], *inputs["dst_csr"],
        inputs["keep"], inputs["scale"], inputs["slope"],
    )  # fmt: skip


def twin_backward(inputs: dict, alpha: np.ndarray, d_agg: np.ndarray) -> dict:
    """``{"d_h_src", "d_h_dst" (None if shared), "att"}`` by the twin's kernels and the
    per-node steps :mod:`refimpl.nn.gat.fused_path_v2` leaves to array operations."""
    h_src, h_dst, att = inputs["h_src"], inputs["h_dst"], inputs["att"]
    shared = h_dst is h_src
    common = (inputs["keep"], inputs["scale"], inputs["slope"])
    d_e, m_dst = twin.backward_targets(
        d_agg, h_src, h_dst, alpha, inputs["src"], *inputs["dst_csr"], *common
    )
    d_h_src, m_src = twin.backward_sources(
        d_agg, h_src, h_dst, att, alpha, d_e, m_dst, shared, inputs["dst"],
        *inputs["src_csr"], *common,
    )  # fmt: skip
    d_att = (h_src * m_src).sum(axis=0)
    if shared:
        return {"d_h_src": d_h_src, "d_h_dst": None, "att": d_att}
    return {"d_h_src": d_h_src, "d_h_dst": m_dst * att, "att": d_att + (h_dst * m_dst).sum(0)}


def magnitudes(inputs: dict, alpha: np.ndarray, d_agg: np.ndarray | None = None) -> dict:
    """The sizes of the terms behind each result (the module docstring), float64 on the host:
    ``alpha`` (E, H) and ``aggregated`` (N, H, C), and with the aggregation's cotangent
    ``d_agg`` (N, H, C) also ``d_h_src``, ``d_h_dst`` (None if shared) and ``att``."""
    src, dst, slope = inputs["src"], inputs["dst"], inputs["slope"]
    h_src, h_dst = (np.abs(inputs[name]).astype(np.float64) for name in ("h_src", "h_dst"))
    att, alpha = np.abs(inputs["att"]).astype(np.float64), alpha.astype(np.float64)
    num_nodes, heads, _ = h_src.shape
    k = max(1.0, slope) + abs(1.0 - slope) + slope
    terms = k * np.einsum("ehc,hc->eh", h_src[src] + h_dst[dst], att)  # (E, H)
    rows = np.zeros((num_nodes, heads))  # R (N, H), the terms are >= 0
    np.maximum.at(rows, dst, terms)
    spread = 1.0 + 2.0 * rows[dst]  # (E, H): alpha's relative difference over rtol
    keep = 1.0 if inputs["keep"] is None else inputs["keep"]
    kept = alpha * (keep * inputs["scale"])  # (E, H)
    aggregated = np.zeros(h_src.shape)
    np.add.at(aggregated, dst, h_src[src] * (kept * spread)[..., None])
    found = {"alpha": alpha * spread, "aggregated": aggregated}
    if d_agg is None:
        return found
    d_agg = np.abs(d_agg).astype(np.float64)
    g = np.einsum("ehc,ehc->eh", d_agg[dst], h_src[src]) * (keep * inputs["scale"])  # (E, H)
    weighted = np.zeros((num_nodes, heads))
    np.add.at(weighted, dst, alpha * g)
    d_e = alpha * (g + weighted[dst]) * (1.0 + spread)  # (E, H)
    sides = []
    for ends in (src, dst):
        m = np.zeros((num_nodes, heads))
        np.add.at(m, ends, k * d_e)
        sides.append(m[..., None] * np.ones_like(att))  # (N, H, C), the same for every c
    d_h_src = np.zeros(h_src.shape)
    np.add.at(d_h_src, src, d_agg[dst] * (kept * spread)[..., None])
    shared = inputs["h_dst"] is inputs["h_src"]
    if shared:
        both = sides[0] + sides[1]
        found |= {"d_h_src": d_h_src + both * att, "d_h_dst": None}
        return found | {"att": (h_src * both).sum(axis=0)}
    found |= {"d_h_src": d_h_src + sides[0] * att, "d_h_dst": sides[1] * att}
    return found | {"att": (h_src * sides[0]).sum(axis=0) + (h_dst * sides[1]).sum(axis=0)}


def assert_within(actual: np.ndarray, expected: np.ndarray, magnitude: np.ndarray, name: str):
    """``|actual - expected| <= FORWARD_RTOL * magnitude`` entry by entry, dtype and shape equal."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
    rtol = FORWARD_RTOL[expected.dtype]
    error = np.abs(actual.astype(np.float64) - expected)
    assert np.all(error <= rtol * magnitude), (name, np.max(error - rtol * magnitude))


CASES = given(
    graph=graphs(max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dropout=st.sampled_from([0.0, 0.5]),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    share=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=seeds(),
)


@pytest.mark.parametrize("backend", BACKENDS)
@CASES
@example(graph=ONE_NODE, heads=2, channels=2, dropout=0.5, slope=0.2, share=False,
         dtype=np.float32, seed=0)  # fmt: skip
@example(graph=EMPTY, heads=1, channels=1, dropout=0.0, slope=0.2, share=True,
         dtype=np.float64, seed=0)  # fmt: skip
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=0.5, slope=0.2,
         share=True, dtype=np.float32, seed=1)  # fmt: skip
def test_forward_twin_matches_the_literal_layer(
    backend, graph, heads, channels, dropout, slope, share, dtype, seed
):
    case = (graph, heads, channels, dropout, slope, share, dtype, seed, backend)
    layer, params, _, out, cache = literal_forward(*case)
    inputs = twin_inputs(layer, params, cache, get_array_module(out))
    alpha, aggregated = twin_forward(inputs)
    bound = magnitudes(inputs, to_numpy(cache.alpha))
    assert_within(alpha, to_numpy(cache.alpha), bound["alpha"], "alpha")
    expected = to_numpy(out).reshape(aggregated.shape)
    assert_within(aggregated, expected, bound["aggregated"], "aggregated")


def literal_attention_gradients(layer, params, cache, d_agg) -> dict:
    """The literal layer's B7-B2 (``GATConv._attention_backward``) on the host."""
    xp = get_array_module(cache.h_src)
    src, dst = cache.graph.src_segments(xp), cache.graph.dst_segments(xp)
    d_agg = asarray(d_agg, backend=backend_name(xp))
    d_h_src, d_h_dst, _, d_att = layer._attention_backward(params, cache, d_agg, src, dst)
    return {
        "d_h_src": to_numpy(d_h_src),
        "d_h_dst": None if d_h_dst is None else to_numpy(d_h_dst),
        "att": to_numpy(d_att["att"]),
    }


def check_backward(case: tuple, kink: bool = False) -> dict:
    """The twin's B7-B2 against the literal layer's, within :func:`magnitudes`; the twin's
    results."""
    layer, params, _, out, cache = literal_forward(*case, kink=kink)
    inputs = twin_inputs(layer, params, cache, get_array_module(out))
    alpha = to_numpy(cache.alpha)
    d_agg = np.random.default_rng(case[-2] + 1).standard_normal(inputs["h_src"].shape)
    d_agg = d_agg.astype(alpha.dtype)
    fused = twin_backward(inputs, alpha, d_agg)
    literal = literal_attention_gradients(layer, params, cache, d_agg)
    bound = magnitudes(inputs, alpha, d_agg)
    for name, value in literal.items():
        if value is None:
            assert fused[name] is None, name
        else:
            assert_within(fused[name], value, bound[name], name)
    return fused


@pytest.mark.parametrize("backend", BACKENDS)
@CASES
@example(graph=ONE_NODE, heads=2, channels=2, dropout=0.5, slope=0.2, share=False,
         dtype=np.float32, seed=0)  # fmt: skip
@example(graph=EMPTY, heads=1, channels=1, dropout=0.0, slope=0.2, share=True,
         dtype=np.float64, seed=0)  # fmt: skip
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=0.5, slope=0.2,
         share=True, dtype=np.float32, seed=1)  # fmt: skip
@example(graph=THREE_LOOPS, heads=2, channels=4, dropout=0.0, slope=0.2, share=False,
         dtype=np.float64, seed=0)  # fmt: skip
def test_backward_twin_matches_the_literal_layer(
    backend, graph, heads, channels, dropout, slope, share, dtype, seed
):
    check_backward((graph, heads, channels, dropout, slope, share, dtype, seed, backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_twin_takes_the_slope_at_the_kink(backend, dtype):
    # W_t = -W_s puts every self-loop's pre at exactly 0 in every channel; the LeakyReLU's
    # derivative there is the slope (PyTorch's, the literal layer's): a twin taking 1 there
    # would be off by (1 - slope) sum d_e h at those nodes, far outside the bound.
    graph = Graph(np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 1, 2, 0]]), 3)
    case = (graph, 2, 3, 0.0, 0.2, False, dtype, 3, backend)
    _, _, _, _, cache = literal_forward(*case, kink=True)
    src, dst = cache.graph.edge_index_on(np)
    assert np.all(to_numpy(cache.score.pre)[src == dst] == 0)  # the case this test is about
    check_backward(case, kink=True)


# -- the CUDA source itself, built on the CPU (tests/kernels/test_gat_fused_source.py) --------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernels' source cannot be compiled on the CPU")
    folder = tmp_path_factory.mktemp("gatv2_fused")
    return {dtype: CompiledSource(folder, dtype, gatv2_fused, "gatv2_fused") for dtype in C_TYPES}


def run_compiled(source, h_src, h_dst, att, d_out, edges, keep, scale, slope) -> tuple:
    """The three kernels of ``source`` in turn: ``(alpha, out, d_e, m_dst, d_h_src, m_src)``."""
    (src, dst), (n, heads, channels), dtype = edges, h_src.shape, h_src.dtype
    dst_csr, src_csr = csr(dst, n), csr(src, n)
    keep_bytes = np.zeros(1, np.uint8) if keep is None else keep.astype(np.uint8)
    has_keep, common = int(keep is not None), (scale, slope, n, heads, channels)
    alpha, out = np.zeros((len(src), heads), dtype), np.zeros((n, heads, channels), dtype)
    source.launch(
        "refimpl_gatv2_forward", n * heads, h_src, h_dst, att, src, *dst_csr, keep_bytes,
        has_keep, *common, alpha, out,
    )  # fmt: skip
    d_e, m_dst = np.zeros_like(alpha), np.zeros_like(h_src)
    source.launch(
        "refimpl_gatv2_backward_targets", n * heads, d_out, h_src, h_dst, alpha, src, *dst_csr,
        keep_bytes, has_keep, *common, d_e, m_dst,
    )  # fmt: skip
    d_h_src, m_src = np.zeros_like(h_src), np.zeros_like(h_src)
    source.launch(
        "refimpl_gatv2_backward_sources", n * heads * channels, d_out, h_src, h_dst, att, alpha,
        d_e, m_dst, int(h_dst is h_src), dst, *src_csr, keep_bytes, has_keep, *common, d_h_src,
        m_src,
    )  # fmt: skip
    return alpha, out, d_e, m_dst, d_h_src, m_src


def run_twin(h_src, h_dst, att, d_out, edges, keep, scale, slope) -> tuple:
    """:func:`run_compiled` by the twin."""
    (src, dst), n = edges, h_src.shape[0]
    dst_csr, src_csr = csr(dst, n), csr(src, n)
    alpha, out = twin.forward(h_src, h_dst, att, src, *dst_csr, keep, scale, slope)
    d_e, m_dst = twin.backward_targets(
        d_out, h_src, h_dst, alpha, src, *dst_csr, keep, scale, slope
    )
    d_h_src, m_src = twin.backward_sources(
        d_out, h_src, h_dst, att, alpha, d_e, m_dst, h_dst is h_src, dst, *src_csr, keep,
        scale, slope,
    )  # fmt: skip
    return alpha, out, d_e, m_dst, d_h_src, m_src


def random_inputs(graph, heads, channels, dropout, share, kink, dtype, seed) -> tuple:
    """``(h_src, h_dst, att, d_out, keep, scale)``; ``kink``: ``h_dst = -h_src``, every
    self-loop's ``pre`` exactly 0."""
    rng, n = np.random.default_rng(seed), graph.num_nodes
    h_src, h_dst, d_out = (rng.standard_normal((n, heads, channels)).astype(dtype) for _ in "sdo")
    if share:
        h_dst = h_src
    elif kink:
        h_dst = -h_src
    att = rng.standard_normal((heads, channels)).astype(dtype)
    keep = rng.random((graph.num_edges, heads)) >= 0.5 if dropout else None
    return h_src, h_dst, att, d_out, keep, 2.0 if dropout else 1.0


@given(
    graph=graphs(max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dropout=st.booleans(),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    share=st.booleans(),
    kink=st.booleans(),
    dtype=st.sampled_from(list(C_TYPES)),
    seed=seeds(),
)
@example(graph=ONE_NODE, heads=2, channels=2, dropout=True, slope=0.2, share=False, kink=False,
         dtype=np.dtype(np.float32), seed=0)  # fmt: skip
@example(graph=LOOPS_AND_DUPLICATES, heads=2, channels=3, dropout=True, slope=0.2, share=False,
         kink=True, dtype=np.dtype(np.float64), seed=1)  # fmt: skip
def test_compiled_kernels_are_bitwise_their_twin(
    compiled, graph, heads, channels, dropout, slope, share, kink, dtype, seed
):
    h_src, h_dst, att, d_out, keep, scale = random_inputs(
        graph, heads, channels, dropout, share, kink, dtype, seed
    )
    arguments = (h_src, h_dst, att, d_out, graph.edge_index, keep, scale, slope)
    names = ("alpha", "out", "d_e", "m_dst", "d_h_src", "m_src")
    found = run_compiled(compiled[dtype], *arguments)
    for name, got, want in zip(names, found, run_twin(*arguments), strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_launchers_give_the_kernels_what_they_declare(compiled, monkeypatch):
    # fused_forward and fused_backward run their real code with ``cupy`` answering from the
    # CPU: an argument out of order, of another width, a placeholder mask where one was
    # given or ``shared`` mistaken would change the results the twin gives.
    fake = types.ModuleType("cupy")
    for name in ("empty", "zeros", "ascontiguousarray", "int64", "uint8"):
        setattr(fake, name, getattr(np, name))
    fake.RawModule = lambda code, options: FakeRawModule(compiled, code, options)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(gatv2_fused, "_module", functools.cache(gatv2_fused._module.__wrapped__))
    graph = Graph(np.array([[0, 0, 1, 2, 2, 2, 4], [0, 0, 1, 1, 1, 3, 1]]), 6)  # 5: isolated
    (src, dst), n = graph.edge_index, graph.num_nodes
    for dtype, dropout, share in [(np.float32, True, False), (np.float64, False, True)]:
        h_src, h_dst, att, d_out, keep, scale = random_inputs(
            graph, 2, 3, dropout, share, False, dtype, 4
        )
        dst_csr, src_csr = csr(dst, n), csr(src, n)
        alpha, out = gatv2_fused.fused_forward(h_src, h_dst, att, src, dst_csr, keep, scale, 0.2)
        d_h_src, m_src, m_dst, d_e = gatv2_fused.fused_backward(
            d_out, h_src, h_dst, att, alpha, (src, dst), (dst_csr, src_csr), keep, scale, 0.2
        )
        want = run_twin(h_src, h_dst, att, d_out, (src, dst), keep, scale, 0.2)
        for got, expected in zip((alpha, out, d_e, m_dst, d_h_src, m_src), want, strict=True):
            assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
