"""``check_pyg_module`` on a module that lives on an accelerator (issue 36): the check runs on a
copy moved to the CPU, in float64, and never moves, casts or otherwise changes the caller's
module. Where no GPU exists a stand-in plays a CUDA module: it fails as one does when its
forward meets tensors on the CPU, unless it was moved there first."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pyg_nn = pytest.importorskip("torch_geometric.nn")

from refimpl.interop import CrosscheckError, check_pyg_module  # noqa: E402

EDGES = np.array([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 2, 2]])  # a ring, a chord, a loop


class OnDevice(pyg_nn.GATConv):
    """A ``GATConv`` that behaves as one on a CUDA device: its forward refuses CPU tensors
    (torch's device-mismatch error) until ``.cpu()`` or ``.to("cpu")`` moves it. The device
    is an instance attribute, so a deep copy carries it and moving the copy leaves the
    original where it was; ``moves`` records what each instance was moved to."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.device_type = "cuda"
        self.moves: list[str] = []

    def cpu(self):
        self._moved("cpu")
        return super().cpu()

    def to(self, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, (str, torch.device)):  # not a dtype or a tensor to match
            self._moved(torch.device(device).type)
        return super().to(*args, **kwargs)

    def _moved(self, device: str) -> None:
        self.device_type = device
        self.moves = [*self.moves, device]  # a new list: a deep copy's is its own anyway

    def forward(self, x, edge_index, *args, **kwargs):
        if self.device_type != x.device.type:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {self.device_type}:0 and {x.device}!"
            )
        return super().forward(x, edge_index, *args, **kwargs)


def test_a_module_on_a_device_is_checked_on_a_cpu_copy_and_left_there() -> None:
    # A module on a CUDA device had no test: run there, its forward would meet the check's
    # CPU inputs and fail on the device mismatch, and moving the user's module would move
    # their model off the GPU. The stand-in fails in the first way unless moved.
    module = OnDevice(4, 3, heads=2)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    x = np.random.default_rng(0).standard_normal((5, 4))
    comparison, notes = check_pyg_module(module, x, EDGES)
    assert comparison.passed and notes == []
    assert module.device_type == "cuda" and module.moves == []  # never moved
    assert module.training and all(p.dtype == torch.float32 for p in module.parameters())
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_without_the_move_the_stand_in_fails_as_a_cuda_module_does(monkeypatch) -> None:
    # The stand-in must be able to fail: with moves made no-ops, a copy stays "on the
    # device" and the check reports PyG's forward failing on the device mismatch.
    monkeypatch.setattr(OnDevice, "_moved", lambda self, device: None)
    x = np.random.default_rng(0).standard_normal((5, 4))
    with pytest.raises(CrosscheckError, match="Expected all tensors to be on the same device"):
        check_pyg_module(OnDevice(4, 3, heads=2), x, EDGES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_real_cuda_module_and_cuda_inputs() -> None:
    module = pyg_nn.GATv2Conv(4, 3, heads=2, edge_dim=2).cuda()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=generator).cuda()
    edge_attr = torch.randn(EDGES.shape[1], 2, generator=generator).cuda()
    comparison, _ = check_pyg_module(module, x, torch.as_tensor(EDGES).cuda(), edge_attr)
    assert comparison.passed
    assert all(p.device.type == "cuda" for p in module.parameters())
