"""Cross-checking other implementations: PyTorch Geometric parameter conversion, golden vectors,
``refimpl crosscheck`` files, and the tensor-by-tensor comparison they all print."""

from refimpl.interop.compare import Comparison, TensorComparison, compare_tensors
from refimpl.interop.crosscheck import CrosscheckError, crosscheck, layer_from_config
from refimpl.interop.golden import export_golden, verify_golden
from refimpl.interop.golden_cases import GOLDEN_CASES
from refimpl.interop.golden_format import GoldenError, read_manifest
from refimpl.interop.pyg import from_pyg, pyg_shapes, to_pyg

__all__ = [
    "GOLDEN_CASES",
    "Comparison",
    "CrosscheckError",
    "GoldenError",
    "TensorComparison",
    "compare_tensors",
    "crosscheck",
    "export_golden",
    "from_pyg",
    "layer_from_config",
    "pyg_shapes",
    "read_manifest",
    "to_pyg",
    "verify_golden",
]
