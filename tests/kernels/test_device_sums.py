"""The device-sum kernel (:mod:`refimpl.kernels.device_sums`) on the CPU, bit for bit.

No GPU is needed: the kernel's own source (``_BODY``, with the parameter list CuPy is given)
is compiled by ``g++`` into a loop over the thread index ``i`` and run through
``row_sums_in_order`` with a CPU stand-in for ``cupy.ElementwiseKernel``. Its sums, the
literal twin's (:mod:`refimpl.naive.device_sums`), the strict stand-in's and the host's
(SciPy's CSR product) must agree bitwise: the kernel exists so that a GPU run repeats the
host's sums exactly, and a tolerance would hide an order or precision slip. The tests skip
when ``g++`` (or, for the device compile, ``nvcc``) is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from refimpl.backend import array_module, to_numpy
from refimpl.kernels import device_sums
from refimpl.kernels.segment import Segments, segment_sum
from refimpl.naive import device_sums as naive
from refimpl.testing.strategies import seeds

DTYPES = st.sampled_from([np.float32, np.float64])
# CuPy's type names in a kernel's parameter list, and the C types they stand for.
C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t"}
CTYPES_SCALARS = {"float32": ctypes.c_float, "float64": ctypes.c_double}
CTYPES_SCALARS |= {"int32": ctypes.c_int32, "int64": ctypes.c_int64}
GUARD = 16  # zeroed entries after each raw array: an off-by-one read gives a wrong sum, no crash


# -- the kernel's source, compiled on the CPU ---------------------------------------------------
def _parameters(text: str) -> list[tuple[bool, str, str]]:
    """``(raw, type, name)`` of each entry of a CuPy parameter list (``"raw T values, ..."``)."""
    found = []
    for entry in text.split(","):
        match = re.fullmatch(r"\s*(raw\s+)?(\w+)\s+(\w+)\s*", entry)
        if match is None:
            raise ValueError(f"cannot read the kernel parameter {entry!r}")
        found.append((match.group(1) is not None, match.group(2), match.group(3)))
    return found


def _c_type(type_name: str) -> str:
    return "T" if type_name == "T" else C_TYPES[type_name]


def kernel_source(in_params: str, out_params: str, body: str, name: str, cuda: bool) -> str:
    """C++ (``cuda=False``: a loop over ``i`` on one CPU thread) or CUDA (a grid-stride loop)
    that runs ``body`` once per output entry ``i``, as CuPy's ``ElementwiseKernel`` does: raw
    inputs are pointers indexed by the body, scalar inputs values, the one output a reference
    to its entry ``i``."""
    inputs, ((raw_out, out_type, out_name),) = _parameters(in_params), _parameters(out_params)
    if raw_out or any(not raw and type_name == "T" for raw, type_name, _ in inputs):
        raise ValueError("the CPU stand-in takes raw array inputs, scalars and one output")
    arguments = [
        f"const {_c_type(t)}{'*' if raw else ''} {argument}" for raw, t, argument in inputs
    ]
    arguments += [f"{_c_type(out_type)}* {out_name}_data_", "const ptrdiff_t size_"]
    if cuda:
        head = f"template <typename T> __global__ void {name}({', '.join(arguments)})"
        loop = (
            "for (ptrdiff_t i = blockIdx.x * (ptrdiff_t)blockDim.x + threadIdx.x; i < size_;"
            " i += (ptrdiff_t)blockDim.x * gridDim.x)"
        )
        instances = "".join(
            f"template __global__ void {name}<{c}>({', '.join(arguments).replace('T', c)});\n"
            for c in ("float", "double")
        )
    else:
        head = f'extern "C" void {name}({", ".join(arguments)})'
        loop, instances = "for (ptrdiff_t i = 0; i < size_; ++i)", ""
    return (
        "#include <cstddef>\n#include <cstdint>\n"
        + ("" if cuda else "typedef REFIMPL_T T;\n")
        + f"{head} {{\n{loop} {{\n{_c_type(out_type)}& {out_name} = {out_name}_data_[i];\n"
        + f"{body}\n}}\n}}\n{instances}"
    )


class CpuKernels:
    """Compiles kernel sources with ``g++`` into ``folder``, once per source and type ``T``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.libraries: dict[tuple[str, str], ctypes.CDLL] = {}

    def function(self, source: str, name: str, t: str) -> ctypes._CFuncPtr:
        key = (source, t)
        if key not in self.libraries:
            stem = self.folder / f"kernel_{len(self.libraries)}"
            stem.with_suffix(".cpp").write_text(source)
            # No -ffast-math: additions in source order, each rounded to T, as on the device.
            subprocess.run(
                ["g++", "-O1", "-shared", "-fPIC", f"-DREFIMPL_T={C_TYPES[t]}", "-o",
                 str(stem.with_suffix(".so")), str(stem.with_suffix(".cpp"))],
                check=True,
            )  # fmt: skip
            self.libraries[key] = ctypes.CDLL(str(stem.with_suffix(".so")))
        return getattr(self.libraries[key], name)


class CpuElementwiseKernel:
    """``cupy.ElementwiseKernel`` for the CPU: the same arguments, the body run by g++'s code."""

    def __init__(self, kernels: CpuKernels, in_params: str, out_params: str, body: str, name: str):
        self.kernels, self.name = kernels, name
        self.inputs, self.outputs = _parameters(in_params), _parameters(out_params)
        self.source = kernel_source(in_params, out_params, body, name, cuda=False)

    def __call__(self, *arguments: object) -> np.ndarray:
        *inputs, out = arguments
        if len(inputs) != len(self.inputs):
            raise TypeError(f"{self.name} takes {len(self.inputs)} inputs, got {len(inputs)}")
        declared = list(zip(arguments, self.inputs + self.outputs, strict=True))
        dtypes = {np.dtype(a.dtype) for a, (_, type_name, _) in declared if type_name == "T"}
        if len(dtypes) != 1 or not out.flags.c_contiguous:  # CuPy: T is one dtype
            raise TypeError(f"{self.name}: T is not one dtype, or the output is not contiguous")
        t = dtypes.pop().name
        values = []
        for argument, (raw, type_name, name) in declared:
            dtype = np.dtype(t if type_name == "T" else type_name)
            if isinstance(argument, np.ndarray) and argument.dtype != dtype:  # CuPy: no casts
                raise TypeError(f"{self.name}: {name} is {argument.dtype}, declared {dtype}")
            if argument is out:
                continue
            if not raw:
                values.append(CTYPES_SCALARS[dtype.name](argument))
                continue
            guarded = np.zeros(argument.size + GUARD, dtype=dtype)
            guarded[: argument.size] = argument.ravel()
            values.append(guarded)
        function = self.kernels.function(self.source, self.name, t)
        pointers = [
            v.ctypes.data_as(ctypes.c_void_p) if isinstance(v, np.ndarray) else v for v in values
        ]
        function(*pointers, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_ssize_t(out.size))
        return out


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> CpuKernels:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernel's source cannot be compiled on the CPU")
    return CpuKernels(tmp_path_factory.mktemp("device_sums"))


@contextlib.contextmanager
def cupy_on_the_cpu(kernels: CpuKernels) -> Iterator[None]:
    """``row_sums_in_order`` runs its real code, with ``cupy`` answering from the CPU."""
    fake = types.ModuleType("cupy")
    fake.ascontiguousarray, fake.empty = np.ascontiguousarray, np.empty
    fake.ElementwiseKernel = lambda *spec: CpuElementwiseKernel(kernels, *spec)
    device_sums._kernel.cache_clear()  # a kernel built by a real CuPy must not be reused
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "cupy", fake)
            yield
    finally:
        device_sums._kernel.cache_clear()


# -- the drawn segmentations ----------------------------------------------------------------------
@st.composite
def segmentations(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """``(index (E,), N)``: empty segments, one segment, many items per segment in any order."""
    num_segments = draw(st.integers(1, 6))
    index = draw(st.lists(st.integers(0, num_segments - 1), max_size=20))
    return np.array(index, dtype=np.int64), num_segments


def spread_values(seed: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Normal values times 10^k, k uniform in [-6, 6]: wide enough that another order of the
    additions (or another accumulator precision) changes the rounded sums."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-6, 6, shape)).astype(dtype)


def device_structure(index: np.ndarray, num_segments: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, indptr)`` as a device gets them: the int32 CSR structure built off NumPy."""
    strict = array_module("strict")
    order, indptr = Segments(strict.asarray(index), num_segments).csr_structure()
    return to_numpy(order), to_numpy(indptr)


def host_sums(values: np.ndarray, index: np.ndarray, num_segments: int) -> np.ndarray:
    return segment_sum(values, Segments(index, num_segments))


def assert_bitwise_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes(), (actual, expected)


EMPTY = (np.array([], dtype=np.int64), 3)  # E = 0: every segment empty
ONE_SEGMENT = (np.zeros(7, dtype=np.int64), 1)
GAPS = (np.array([4, 0, 4, 4, 0, 4], dtype=np.int64), 6)  # segments 1, 2, 3 and 5 empty


# -- the twin, the kernel and the strict stand-in against the host ------------------------------
@given(segmentation=segmentations(), features=st.integers(1, 3), dtype=DTYPES, seed=seeds())
@example(segmentation=EMPTY, features=2, dtype=np.float64, seed=0)
@example(segmentation=ONE_SEGMENT, features=1, dtype=np.float32, seed=1)
@example(segmentation=GAPS, features=3, dtype=np.float32, seed=2)
def test_twin_sums_bitwise_as_the_host(segmentation, features, dtype, seed):
    index, num_segments = segmentation
    values = spread_values(seed, (len(index), features), dtype)
    twin = naive.row_sums_in_order(values, *device_structure(index, num_segments))
    assert_bitwise_equal(twin, host_sums(values, index, num_segments))


@given(segmentation=segmentations(), features=st.integers(1, 3), dtype=DTYPES, seed=seeds())
@example(segmentation=EMPTY, features=2, dtype=np.float64, seed=0)
@example(segmentation=ONE_SEGMENT, features=1, dtype=np.float32, seed=1)
@example(segmentation=GAPS, features=3, dtype=np.float64, seed=2)
def test_kernel_source_sums_bitwise_as_its_twin_and_the_host(
    kernels, segmentation, features, dtype, seed
):
    index, num_segments = segmentation
    values = spread_values(seed, (len(index), features), dtype)
    order, indptr = device_structure(index, num_segments)
    with cupy_on_the_cpu(kernels):
        device = device_sums.row_sums_in_order(values, order, indptr)
    assert_bitwise_equal(device, naive.row_sums_in_order(values, order, indptr))
    assert_bitwise_equal(device, host_sums(values, index, num_segments))


@given(segmentation=segmentations(), features=st.integers(1, 3), dtype=DTYPES, seed=seeds())
@example(segmentation=EMPTY, features=2, dtype=np.float32, seed=0)
@example(segmentation=ONE_SEGMENT, features=1, dtype=np.float64, seed=1)
@example(segmentation=GAPS, features=3, dtype=np.float32, seed=2)
def test_strict_segment_sum_is_bitwise_the_hosts(segmentation, features, dtype, seed):
    # The strict stand-in plays the device on the CPU, so it must sum in the host's order.
    index, num_segments = segmentation
    values = spread_values(seed, (len(index), features), dtype)
    strict = array_module("strict")
    on_strict = segment_sum(strict.asarray(values), Segments(strict.asarray(index), num_segments))
    assert_bitwise_equal(to_numpy(on_strict), host_sums(values, index, num_segments))


# -- named cases: the order and the precision of the additions ------------------------------------
TINY32 = 2.0**-24  # half an ulp of 1 in float32: 1 + TINY32 rounds (to even) back to 1


@pytest.mark.parametrize(
    ("items", "dtype", "expected"),
    [
        ([1.0, TINY32, TINY32], np.float32, 1.0),  # each tiny term rounds away after the 1
        ([TINY32, TINY32, 1.0], np.float32, 1.0 + 2 * TINY32),  # the tiny terms add up first
        ([1.0, 2.0**-30], np.float64, 1.0 + 2.0**-30),  # exact in float64, lost in float32
    ],
)
def test_sums_run_left_to_right_in_the_values_precision(kernels, items, dtype, expected):
    # One segment whose items sit in reverse item order in `values`: the sum must take them
    # by `order` (item order), each addition rounded to the values' dtype.
    in_item_order = np.array(items, dtype=dtype).reshape(-1, 1)  # (E, 1)
    reversed_rows = in_item_order[::-1].copy()
    order = np.arange(len(items), dtype=np.int32)[::-1].copy()  # item j sits in row E - 1 - j
    indptr = np.array([0, len(items)], dtype=np.int32)
    want = np.array([[expected]], dtype=dtype)
    with cupy_on_the_cpu(kernels):
        assert_bitwise_equal(device_sums.row_sums_in_order(reversed_rows, order, indptr), want)
    assert_bitwise_equal(naive.row_sums_in_order(reversed_rows, order, indptr), want)
    one_segment = Segments(np.zeros(len(items), dtype=np.int64), 1)
    assert_bitwise_equal(segment_sum(in_item_order, one_segment), want)


def test_kernel_source_compiles_for_the_device(tmp_path):
    # The CPU runs above execute _BODY as C++; this holds the same text to CUDA (nvcc, to PTX).
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the kernel's CUDA source cannot be compiled here")
    in_params, out_params, name = kernel_parameters()
    source = tmp_path / "kernel.cu"
    source.write_text(kernel_source(in_params, out_params, device_sums._BODY, name, cuda=True))
    ptx = tmp_path / "kernel.ptx"
    subprocess.run(["nvcc", "-ptx", "-o", str(ptx), str(source)], check=True)
    assert len(re.findall(rf"\.entry\s+\S*{name}", ptx.read_text())) == 2  # float, double


def kernel_parameters() -> tuple[str, str, str]:
    """``(in_params, out_params, name)`` the module gives ``cupy.ElementwiseKernel``."""
    captured = []
    fake = types.ModuleType("cupy")
    fake.ElementwiseKernel = lambda in_params, out_params, body, name: captured.append(
        (in_params, out_params, name)
    )
    device_sums._kernel.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "cupy", fake)
            device_sums._kernel()
    finally:
        device_sums._kernel.cache_clear()
    return captured[0]
