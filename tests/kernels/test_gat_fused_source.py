"""The fused GAT path's CUDA sources themselves, compiled on the CPU, against their twins.

No GPU is needed: ``g++`` compiles :func:`refimpl.kernels.gat_fused.cuda_sources` (the text
CuPy compiles for the device) with a few lines standing in for CUDA (``__global__``,
``blockIdx``), and each kernel is run once per thread index. ``exp`` is NumPy's, called back
through ``ctypes``: the twin and the literal layer use NumPy's, the device CUDA's, so a
libm ``exp`` here would test the libraries, not the kernels (``expm1`` likewise, for ELU).
Everything else (index arithmetic, loop bounds, the order and precision of each operation) is
the source's, so the twin (:mod:`refimpl.kernels.gat_fused_twin`) must agree bitwise; so
must the score halves' backward (:mod:`refimpl.kernels.gat_fused_scores`) and ELU
(:mod:`refimpl.kernels.elu_fused`) with theirs. Skips without ``g++``.
"""

from __future__ import annotations

import ctypes
import functools
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.graph import Graph
from refimpl.kernels import elu_fused, gat_fused, gat_fused_scores
from refimpl.kernels import gat_fused_twin as twin
from refimpl.kernels.segment import Segments
from refimpl.testing.strategies import graphs, seeds

C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
SCALARS = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
CUDA_ON_THE_CPU = """
#define __global__
#define __device__ static inline
struct refimpl_dim3 { unsigned x; };
static refimpl_dim3 blockIdx = {0}, blockDim = {1}, threadIdx = {0};
static REFIMPL_T (*refimpl_exp)(REFIMPL_T);
static REFIMPL_T (*refimpl_expm1)(REFIMPL_T);
#define exp(x) refimpl_exp(x)
#define expf(x) refimpl_exp(x)
#define expm1(x) refimpl_expm1(x)
extern "C" void refimpl_thread(unsigned block, REFIMPL_T (*exp_)(REFIMPL_T),
                               REFIMPL_T (*expm1_)(REFIMPL_T)) {
    blockIdx.x = block;
    refimpl_exp = exp_;
    refimpl_expm1 = expm1_;
}
"""


class CompiledSource:
    """The kernels of one dtype's source, run thread by thread (one thread per block)."""

    def __init__(self, folder, dtype: np.dtype, module=gat_fused, stem: str = "gat_fused") -> None:
        self.dtype = dtype
        name = f"{stem}_{dtype.name}"
        path = folder / f"{name}.cpp"
        path.write_text(CUDA_ON_THE_CPU + module.cuda_sources()[name])
        # No -ffast-math and no contraction: every operation rounded to T, as with --fmad=false.
        subprocess.run(
            ["g++", "-O1", "-shared", "-fPIC", "-ffp-contract=off",
             f"-DREFIMPL_T={C_TYPES[dtype]}", "-o", str(path.with_suffix(".so")), str(path)],
            check=True,
        )  # fmt: skip
        self.library = ctypes.CDLL(str(path.with_suffix(".so")))
        scalar = SCALARS[dtype]
        self.exp = ctypes.CFUNCTYPE(scalar, scalar)(lambda x: float(np.exp(dtype.type(x))))
        self.expm1 = ctypes.CFUNCTYPE(scalar, scalar)(lambda x: float(np.expm1(dtype.type(x))))
        self.signatures = {
            kernel: [self._ctype(p) for p in parameters.split(",")]
            for kernel, parameters in re.findall(
                r'extern "C" __global__ void (\w+)\((.*?)\)', module.SOURCE, re.DOTALL
            )
        }

    def _ctype(self, parameter: str) -> type:
        if "*" in parameter:
            return ctypes.c_void_p
        if "long long" in parameter:
            return ctypes.c_int64
        if re.search(r"\bint\b", parameter):
            return ctypes.c_int32
        return SCALARS[self.dtype]  # T

    def launch(self, kernel: str, threads: int, *arguments: object) -> None:
        function = getattr(self.library, kernel)
        types = self.signatures[kernel]
        values = [
            a.ctypes.data_as(ctypes.c_void_p) if isinstance(a, np.ndarray) else t(a)
            for a, t in zip(arguments, types, strict=True)
        ]
        for i in range(threads):
            self.library.refimpl_thread(ctypes.c_uint(i), self.exp, self.expm1)
            function(*values)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernels' source cannot be compiled on the CPU")
    folder = tmp_path_factory.mktemp("gat_fused")
    return {dtype: CompiledSource(folder, dtype) for dtype in C_TYPES}


@pytest.fixture(scope="module")
def compiled_others(compiled, tmp_path_factory) -> dict:
    """The score halves' and ELU's sources, by ``(stem, dtype)``."""
    folder = tmp_path_factory.mktemp("gat_fused_others")
    modules = {"gat_fused_scores": gat_fused_scores, "elu": elu_fused}
    return {
        (stem, dtype): CompiledSource(folder, dtype, module, stem)
        for stem, module in modules.items()
        for dtype in C_TYPES
    }


def csr(index: np.ndarray, num_segments: int) -> tuple[np.ndarray, np.ndarray]:
    order, indptr = Segments(index, num_segments).csr_structure()
    return order.astype(np.int32), indptr.astype(np.int32)


def assert_bitwise_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes(), (actual, expected)


@given(
    graph=graphs(max_nodes=6, max_edges=12),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dropout=st.booleans(),
    slope=st.sampled_from([0.2, 0.0, 1.5]),
    dtype=st.sampled_from(list(C_TYPES)),
    kink=st.booleans(),
    seed=seeds(),
)
@example(graph=Graph(np.zeros((2, 0), dtype=np.int64), 1), heads=2, channels=2, dropout=True,
         slope=0.2, dtype=np.dtype(np.float32), kink=False, seed=0)  # fmt: skip
@example(graph=Graph(np.array([[0, 0, 1, 2, 2], [0, 0, 1, 1, 3]]), 5), heads=2, channels=3,
         dropout=True, slope=0.2, dtype=np.dtype(np.float64), kink=True, seed=1)  # fmt: skip
def test_compiled_kernels_are_bitwise_their_twin(
    compiled, graph, heads, channels, dropout, slope, dtype, kink, seed
):
    rng = np.random.default_rng(seed)
    n, (src, dst) = graph.num_nodes, graph.edge_index
    num_edges = len(src)
    score_src, score_dst = (rng.standard_normal((n, heads)).astype(dtype) for _ in range(2))
    if kink:  # every self-loop's score exactly 0: the LeakyReLU's derivative there is the slope
        score_dst = -score_src
    h_src = rng.standard_normal((n, heads, channels)).astype(dtype)
    d_out = rng.standard_normal((n, heads, channels)).astype(dtype)
    keep = rng.random((num_edges, heads)) >= 0.5 if dropout else None
    scale = 2.0 if dropout else 1.0
    dst_csr, src_csr = csr(dst, n), csr(src, n)
    source = compiled[dtype]
    keep_bytes = np.zeros(1, np.uint8) if keep is None else keep.astype(np.uint8)
    has_keep = int(keep is not None)
    # F1-F3
    alpha, out = np.zeros((num_edges, heads), dtype), np.zeros((n, heads, channels), dtype)
    source.launch(
        "refimpl_gat_forward", n * heads * channels, score_src, score_dst, h_src, src,
        *dst_csr, keep_bytes, has_keep, scale, slope, n, heads, channels, alpha, out,
    )  # fmt: skip
    want_alpha, want_out = twin.forward(
        score_src, score_dst, h_src, src, *dst_csr, keep, scale, slope
    )
    assert_bitwise_equal(alpha, want_alpha)
    assert_bitwise_equal(out, want_out)
    # B3-B1 over the targets, then over the sources
    d_pre, d_score_dst = np.zeros_like(alpha), np.zeros((n, heads), dtype)
    source.launch(
        "refimpl_gat_backward_targets", n * heads, d_out, h_src, alpha, score_src, score_dst,
        src, *dst_csr, keep_bytes, has_keep, scale, slope, n, heads, channels, d_pre,
        d_score_dst,
    )  # fmt: skip
    want_d_pre, want_d_score_dst = twin.backward_targets(
        d_out, h_src, alpha, score_src, score_dst, src, *dst_csr, keep, scale, slope
    )
    assert_bitwise_equal(d_pre, want_d_pre)
    assert_bitwise_equal(d_score_dst, want_d_score_dst)
    d_h_src, d_score_src = np.zeros_like(h_src), np.zeros((n, heads), dtype)
    source.launch(
        "refimpl_gat_backward_sources", n * heads * channels, d_out, alpha, d_pre, dst, *src_csr,
        keep_bytes, has_keep, scale, n, heads, channels, d_h_src, d_score_src,
    )  # fmt: skip
    want_d_h_src, want_d_score_src = twin.backward_sources(
        d_out, alpha, d_pre, dst, *src_csr, keep, scale, n
    )
    assert_bitwise_equal(d_h_src, want_d_h_src)
    assert_bitwise_equal(d_score_src, want_d_score_src)


class FakeRawModule:
    """``cupy.RawModule`` running the CPU-compiled source: ``get_function(name)(grid, block,
    args)`` runs the kernel once per thread of the launch, with the launchers' own arguments."""

    def __init__(self, compiled: dict, code: str, options: tuple) -> None:
        assert "--fmad=false" in options  # the bitwise claim rests on it
        c_type = re.match(r"#define REFIMPL_T (\w+)", code).group(1)
        self.source = next(s for dtype, s in compiled.items() if C_TYPES[dtype] == c_type)

    def get_function(self, name: str):
        def launch(grid: tuple, block: tuple, arguments: tuple) -> None:
            self.source.launch(name, grid[0] * block[0], *arguments)

        return launch


def test_launchers_give_the_kernels_what_they_declare(compiled, monkeypatch):
    # fused_forward and fused_backward run their real code with ``cupy`` answering from the
    # CPU: a launcher passing an argument out of order, of another width, or an empty
    # placeholder mask where one was given would change the results the twin gives.
    fake = types.ModuleType("cupy")
    for name in ("empty", "zeros", "ascontiguousarray", "int64", "uint8"):
        setattr(fake, name, getattr(np, name))
    fake.RawModule = lambda code, options: FakeRawModule(compiled, code, options)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(gat_fused, "_module", functools.cache(gat_fused._module.__wrapped__))
    graph = Graph(np.array([[0, 0, 1, 2, 2, 2, 4], [0, 0, 1, 1, 1, 3, 1]]), 6)  # 5: isolated
    (src, dst), n, heads, channels = graph.edge_index, 6, 2, 3
    for dtype, keep in [(np.dtype(np.float32), True), (np.dtype(np.float64), False)]:
        rng = np.random.default_rng(4)
        score_src, score_dst = (rng.standard_normal((n, heads)).astype(dtype) for _ in range(2))
        h_src, d_out = (rng.standard_normal((n, heads, channels)).astype(dtype) for _ in range(2))
        mask = rng.random((len(src), heads)) >= 0.5 if keep else None
        dst_csr, src_csr = csr(dst, n), csr(src, n)
        alpha, out = gat_fused.fused_forward(
            score_src, score_dst, h_src, src, dst_csr, mask, 2.0, 0.2
        )
        want_alpha, want_out = twin.forward(
            score_src, score_dst, h_src, src, *dst_csr, mask, 2.0, 0.2
        )
        assert_bitwise_equal(alpha, want_alpha)
        assert_bitwise_equal(out, want_out)
        d_h_src, d_score_src, d_score_dst = gat_fused.fused_backward(
            d_out, h_src, alpha, score_src, score_dst, (src, dst), (dst_csr, src_csr), mask,
            2.0, 0.2,
        )  # fmt: skip
        d_pre, want_d_score_dst = twin.backward_targets(
            d_out, h_src, alpha, score_src, score_dst, src, *dst_csr, mask, 2.0, 0.2
        )
        want_d_h_src, want_d_score_src = twin.backward_sources(
            d_out, alpha, d_pre, dst, *src_csr, mask, 2.0, n
        )
        assert_bitwise_equal(d_score_dst, want_d_score_dst)
        assert_bitwise_equal(d_h_src, want_d_h_src)
        assert_bitwise_equal(d_score_src, want_d_score_src)


@given(
    nodes=st.integers(0, 5),
    heads=st.integers(1, 3),
    channels=st.integers(1, 4),
    dtype=st.sampled_from(list(C_TYPES)),
    seed=seeds(),
)
def test_compiled_score_halves_kernel_is_bitwise_its_twin(
    compiled_others, nodes, heads, channels, dtype, seed
):
    rng = np.random.default_rng(seed)
    d_h = rng.standard_normal((nodes, heads, channels)).astype(dtype)
    d_score_src, d_score_dst = (rng.standard_normal((nodes, heads)).astype(dtype) for _ in "sd")
    att_src, att_dst = (rng.standard_normal((heads, channels)).astype(dtype) for _ in "sd")
    d_h_src, d_h_dst = np.zeros_like(d_h), np.zeros_like(d_h)
    compiled_others["gat_fused_scores", dtype].launch(
        "refimpl_gat_score_halves_backward", d_h.size, d_h, d_score_src, d_score_dst, att_src,
        att_dst, nodes, heads, channels, d_h_src, d_h_dst,
    )  # fmt: skip
    want_src, want_dst = gat_fused_scores.score_halves_backward_twin(
        d_h, d_score_src, d_score_dst, att_src, att_dst
    )
    assert_bitwise_equal(d_h_src, want_src)
    assert_bitwise_equal(d_h_dst, want_dst)


@given(
    size=st.integers(0, 12),
    alpha=st.sampled_from([1.0, 0.5, 2.0]),
    dtype=st.sampled_from(list(C_TYPES)),
    seed=seeds(),
)
def test_compiled_elu_kernels_are_bitwise_their_twins(compiled_others, size, alpha, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(size) * 3).astype(dtype)
    x[: size // 4] = 0  # the kink itself
    d_y = rng.standard_normal(size).astype(dtype)
    source = compiled_others["elu", dtype]
    y, d_x = np.zeros_like(x), np.zeros_like(x)
    source.launch("refimpl_elu_forward", size, x, alpha, size, y)
    source.launch("refimpl_elu_backward", size, x, d_y, alpha, size, d_x)
    assert_bitwise_equal(y, elu_fused.elu_forward_twin(x, alpha))
    assert_bitwise_equal(d_x, elu_fused.elu_backward_twin(x, d_y, alpha))


def test_the_score_halves_and_elu_launchers_give_the_kernels_what_they_declare(
    compiled_others, monkeypatch
):
    # The CuPy launchers run their real code with ``cupy`` answering from the CPU, as above.
    fake = types.ModuleType("cupy")
    for name in ("empty_like", "ascontiguousarray"):
        setattr(fake, name, getattr(np, name))
    stems = {"refimpl_elu_forward": "elu", "refimpl_gat_score_halves_backward": "gat_fused_scores"}

    def raw_module(code: str, options: tuple) -> FakeRawModule:
        stem = next(stem for kernel, stem in stems.items() if kernel in code)
        sources = {dtype: compiled_others[stem, dtype] for dtype in C_TYPES}
        return FakeRawModule(sources, code, options)

    fake.RawModule = raw_module
    monkeypatch.setitem(sys.modules, "cupy", fake)
    for module in (elu_fused, gat_fused_scores):
        monkeypatch.setattr(module, "_module", functools.cache(module._module.__wrapped__))
    rng = np.random.default_rng(5)
    for dtype in C_TYPES:
        d_h = rng.standard_normal((4, 2, 3)).astype(dtype)
        halves = [rng.standard_normal((4, 2)).astype(dtype) for _ in "sd"]
        att = [rng.standard_normal((2, 3)).astype(dtype) for _ in "sd"]
        found = gat_fused_scores.score_halves_backward(fake, d_h, *halves, *att)
        wanted = gat_fused_scores.score_halves_backward_twin(d_h, *halves, *att)
        for got, want in zip(found, wanted, strict=True):
            assert_bitwise_equal(got, want)
        x, d_y = d_h[:, 0, :] * 3, d_h[:, 1, :]  # (4, 3), not contiguous
        assert_bitwise_equal(
            elu_fused.elu_forward(fake, x, 0.5), elu_fused.elu_forward_twin(x, 0.5)
        )
        assert_bitwise_equal(
            elu_fused.elu_backward(fake, x, d_y, 0.5), elu_fused.elu_backward_twin(x, d_y, 0.5)
        )
