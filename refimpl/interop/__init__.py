"""Cross-checking other implementations: PyTorch Geometric parameter conversion, a PyG module
checked in one call, golden vectors, ``refimpl crosscheck`` files, and the tensor-by-tensor
comparison they all print. The differential property test, a layer checked on every small graph
Hypothesis draws, is :mod:`refimpl.interop.differential` (imported on its own: it needs
Hypothesis)."""

from refimpl.interop.compare import Comparison, TensorComparison, compare_tensors
from refimpl.interop.crosscheck import (
    CrosscheckError,
    crosscheck,
    crosscheck_arrays,
    layer_from_config,
)
from refimpl.interop.golden import export_golden, verify_golden
from refimpl.interop.golden_cases import GOLDEN_CASES
from refimpl.interop.golden_format import GoldenError, read_manifest
from refimpl.interop.pyg import from_pyg, pyg_shapes, to_pyg
from refimpl.interop.pyg_module import check_pyg_module, pyg_config

__all__ = [
    "GOLDEN_CASES",
    "Comparison",
    "CrosscheckError",
    "GoldenError",
    "TensorComparison",
    "check_pyg_module",
    "compare_tensors",
    "crosscheck",
    "crosscheck_arrays",
    "export_golden",
    "from_pyg",
    "layer_from_config",
    "pyg_config",
    "pyg_shapes",
    "read_manifest",
    "to_pyg",
    "verify_golden",
]
