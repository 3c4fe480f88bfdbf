"""Every CUDA kernel source in refimpl/kernels compiles to PTX, with no floating-point atomic.

A float atomic adds in the order its updates land, which changes from run to run: the
kernels promise bitwise repeats, so every float sum must be a loop over a CSR row or a
fixed tree (issue 38). The sources are compiled as the kernels' modules compile them for the
device, with ``--fmad=false`` (the kernels claim bitwise equality with their twins, which
a contracted ``a * b + c`` would break), and the PTX is searched for ``atom``/``red`` on a
float type. Skips without ``nvcc``; needs no GPU.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import refimpl.kernels

FLOAT_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.(?:f16|bf16|f32|f64)(?:x2)?\b")
LAUNCHERS = re.compile(r"\b(?:RawKernel|RawModule|ElementwiseKernel|ReductionKernel)\b")
KERNEL_MODULES = [
    f"refimpl.kernels.{info.name}" for info in pkgutil.iter_modules(refimpl.kernels.__path__)
]


def needs_nvcc() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the kernels' CUDA sources cannot be compiled here")


def compile_to_ptx(source: str, folder: Path, stem: str) -> str:
    path = folder / f"{stem}.cu"
    path.write_text(source)
    command = ["nvcc", "-ptx", "--fmad=false", "-o", str(path.with_suffix(".ptx")), str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, f"{stem} does not compile:\n{done.stderr}"
    return path.with_suffix(".ptx").read_text()


def float_atomics(ptx: str) -> list[str]:
    return sorted({match.group(0) for match in FLOAT_ATOMIC.finditer(ptx)})


def all_sources() -> list[tuple[str, str, str]]:
    """``(module, name, source)`` of every kernel source the kernel modules declare."""
    found = []
    for module_name in KERNEL_MODULES:
        module = importlib.import_module(module_name)
        for name, source in getattr(module, "cuda_sources", dict)().items():
            found.append((module_name, name, source))
    return found


def test_every_module_that_builds_a_kernel_declares_its_sources():
    # A kernel the PTX test does not see could bring back an atomic unnoticed.
    for module_name in KERNEL_MODULES:
        module = importlib.import_module(module_name)
        text = Path(module.__file__).read_text()
        if LAUNCHERS.search(text):
            assert hasattr(module, "cuda_sources"), f"{module_name} builds a kernel"
    assert {module for module, _, _ in all_sources()} >= {
        "refimpl.kernels.device_sums",
        "refimpl.kernels.gat_fused",
    }


@pytest.mark.parametrize(("module", "name", "source"), all_sources(), ids=lambda v: v[:40])
def test_kernel_source_compiles_without_float_atomics(tmp_path, module, name, source):
    needs_nvcc()
    ptx = compile_to_ptx(source, tmp_path, name)
    assert re.search(r"\.entry\s", ptx), f"{module}: {name} has no kernel entry"
    assert float_atomics(ptx) == [], f"{module}: {name} uses float atomics"


@pytest.mark.parametrize(("c_type", "expected"), [("float", "f32"), ("double", "f64")])
def test_the_check_finds_a_compiled_float_atomic(tmp_path, c_type, expected):
    # The search must be able to fail: nvcc's form of a float atomicAdd is found.
    needs_nvcc()
    source = (
        f'extern "C" __global__ void adds({c_type}* out, {c_type}* seen, {c_type} value) '
        "{ seen[threadIdx.x] = atomicAdd(out, value); }"
    )
    assert float_atomics(compile_to_ptx(source, tmp_path, "atomic")) == [
        f"atom.global.add.{expected}"
    ]


@pytest.mark.parametrize(
    ("line", "is_float_atomic"),
    [
        ("atom.global.add.f32 %f2, [%rd1], %f1;", True),
        ("atom.add.f64 %fd2, [%rd1], %fd1;", True),
        ("red.global.add.f32 [%rd1], %f1;", True),  # an atomic whose result is unused
        ("red.add.f64 [%rd1], %fd1;", True),
        ("atom.global.add.noftz.f16 %h2, [%rd1], %h1;", True),
        ("atom.global.add.noftz.bf16x2 %r2, [%rd1], %r1;", True),
        ("atom.global.add.u32 %r2, [%rd1], 1;", False),  # integer atomics are order-free
        ("red.global.or.b32 [%rd1], %r1;", False),
        ("add.f32 %f3, %f1, %f2;", False),
    ],
)
def test_the_pattern_names_every_float_atomic_form(line, is_float_atomic):
    assert bool(float_atomics(line)) is is_float_atomic
