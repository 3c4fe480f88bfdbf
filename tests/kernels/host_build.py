"""A kernel's CUDA source built for the host with ``g++``, for the host-build tests.

The source's CUDA qualifiers and thread indices come from the test's ``shim`` (a few C++
lines: ``__global__`` and ``__device__`` as nothing, ``blockIdx`` and friends as settable
globals); ``extern "C" __global__`` becomes ``extern "C"`` so that ``ctypes`` finds each
kernel. ``-ffp-contract=off`` keeps every product rounded, as ``--fmad=false`` does on the
device.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path


def build(folder: Path, stem: str, shim: str, source: str) -> ctypes.CDLL:
    """``shim`` and ``source`` compiled into ``folder/stem.so`` and loaded."""
    path = folder / f"{stem}.cpp"
    path.write_text(shim + source.replace('extern "C" __global__', 'extern "C"'))
    library = path.with_suffix(".so")
    subprocess.run(
        ["g++", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(library), str(path)],
        check=True,
    )
    return ctypes.CDLL(str(library))
