"""``refimpl crosscheck`` on files that cannot be checked (exit 2 and a message, never a
traceback), :func:`refimpl.files.read_npz` itself, and gradients under PyG's names matched
through the layer's state-dict layout (twins, keys refimpl has no counterpart for)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from refimpl import Graph
from refimpl.cli import main
from refimpl.files import read_npz
from refimpl.interop.crosscheck import TOLERANCES, CrosscheckError, crosscheck
from refimpl.interop.pyg import to_pyg
from refimpl.nn import GATConv, TransformerConv
from refimpl.testing.tolerances import FORWARD_RTOL, GRADIENT_RTOL
from tests.interop.test_crosscheck import write_file


@pytest.fixture
def parts() -> tuple[np.random.Generator, Graph, np.ndarray]:
    rng = np.random.default_rng(3)
    graph = Graph(np.array([[0, 1, 2, 3, 3, 1], [1, 2, 0, 0, 1, 1]]), 5)  # node 4 isolated
    return rng, graph, rng.standard_normal((5, 4))


def refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command on ``path``; it must exit 2 with a one-line message on stderr."""
    assert main(["crosscheck", str(path)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith("refimpl crosscheck: error: ")
    return captured.err


def gat_file(path: Path, parts, **extra: object) -> dict[str, np.ndarray]:
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2)
    return write_file(path, layer, layer.init_params(rng), x, graph, **extra)


# -- files that are not an .npz of plain arrays ---------------------------------------------------
def test_an_empty_file_is_refused_with_a_message(tmp_path, capsys) -> None:
    (tmp_path / "empty.npz").write_bytes(b"")
    assert "empty.npz is empty" in refused(tmp_path / "empty.npz", capsys)


def test_a_bare_npy_is_refused_with_a_message(parts, tmp_path, capsys) -> None:
    _, _, x = parts
    with open(tmp_path / "x.npz", "wb") as stream:  # .npy content under an .npz name
        np.save(stream, x)
    np.save(tmp_path / "x.npy", x)
    for name in ("x.npz", "x.npy"):
        assert f"{name} holds a single array (.npy)" in refused(tmp_path / name, capsys)


def test_pickled_arrays_are_refused_not_loaded(parts, tmp_path, capsys) -> None:
    arrays = gat_file(tmp_path / "f.npz", parts)
    arrays["input/x"] = np.array([{"not": "an array"}], dtype=object)
    np.savez(tmp_path / "pickled.npz", **arrays)  # savez pickles object arrays
    assert "pickled.npz is not a readable .npz" in refused(tmp_path / "pickled.npz", capsys)


def test_a_missing_file_is_named(tmp_path, capsys) -> None:
    assert "no crosscheck file at" in refused(tmp_path / "missing.npz", capsys)


# -- read_npz --------------------------------------------------------------------------------------
def test_read_npz_returns_every_array_in_order(tmp_path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"b": rng.standard_normal((2, 3)), "a/x": np.arange(4), "c": np.array("text")}
    np.savez(tmp_path / "f.npz", **arrays)
    read = read_npz(tmp_path / "f.npz")
    assert list(read) == list(arrays)
    for key, value in arrays.items():
        assert read[key].dtype == value.dtype
        np.testing.assert_array_equal(read[key], value)


class MyError(ValueError):
    pass


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "is empty"), (b"not a zip", "is not a readable .npz"), (None, "single array")],
)
def test_read_npz_raises_the_callers_error_with_its_hint(tmp_path, content, message) -> None:
    path = tmp_path / "f.npz"
    if content is None:
        with open(path, "wb") as stream:
            np.save(stream, np.zeros(3))
    else:
        path.write_bytes(content)
    with pytest.raises(MyError, match=message) as caught:
        read_npz(path, MyError, "do this instead")
    assert str(caught.value).endswith("; do this instead")
    with pytest.raises(FileNotFoundError, match="no thing at"):
        read_npz(tmp_path / "absent.npz", MyError, "hint", what="thing")
    with pytest.raises(FileNotFoundError):  # a directory is not a file
        read_npz(tmp_path, MyError, "hint")


# -- configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([1], "config must be a JSON object"),
        ("GATConv", "config must be a JSON object"),
        ({"framework": "pyg", "layer": "GATConv", "kwargs": [4, 3]}, "kwargs must be a JSON"),
        (
            {"framework": "refimpl", "layer": "GATConv", "kwargs": {"in_channel": 4}},
            "cannot build our GATConv",
        ),
    ],
)
def test_malformed_configs_are_refused(config, message, parts, tmp_path, capsys) -> None:
    gat_file(tmp_path / "f.npz", parts, config=np.array(json.dumps(config)))
    assert message in refused(tmp_path / "f.npz", capsys)


def test_an_unsupported_dtype_is_refused_before_any_tolerance_is_used(parts, tmp_path) -> None:
    arrays = gat_file(tmp_path / "f.npz", parts)
    arrays["input/x"] = np.ones((5, 4), dtype=np.int64)
    np.savez(tmp_path / "int.npz", **arrays)
    for rtol in (None, 1e-3):  # with rtol given too: refused as the file's, in one line
        with pytest.raises(CrosscheckError, match="input/x has dtype int64; every entry but"):
            crosscheck(tmp_path / "int.npz", rtol=rtol)
    arrays["input/x"] = np.ones((5, 4), dtype=np.float16)  # floats, but no tolerance for them
    np.savez(tmp_path / "half.npz", **arrays)
    with pytest.raises(CrosscheckError, match="input/x has dtype float16; use float32 or float64"):
        crosscheck(tmp_path / "half.npz")


def test_tolerances_come_from_the_shared_tables(parts, tmp_path) -> None:
    assert set(TOLERANCES) == set(FORWARD_RTOL) == set(GRADIENT_RTOL)
    gat_file(tmp_path / "f.npz", parts)
    result, _ = crosscheck(tmp_path / "f.npz")
    f64 = np.dtype(np.float64)
    rtols = {t.name: t.rtol for t in result.tensors}
    assert rtols.pop("out") == FORWARD_RTOL[f64]
    assert set(rtols.values()) == {GRADIENT_RTOL[f64]}


# -- gradients under PyG's names, through the layout ----------------------------------------------
def test_a_missing_gradient_is_not_borrowed_from_an_equal_parameter(parts, tmp_path, capsys):
    # PyG starts the output bias at zero, as are GATv2's projection biases: equal values must
    # not make one parameter's gradient stand in for another's
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2, version="v2")
    params = layer.init_params(rng)
    params["bias"] = np.zeros_like(params["bias"])
    arrays = write_file(tmp_path / "f.npz", layer, params, x, graph, framework="pyg")
    del arrays["grad/param/bias"]
    np.savez(tmp_path / "g.npz", **arrays)
    assert "not for ['bias']" in refused(tmp_path / "g.npz", capsys)


def test_an_unused_lin_skip_needs_no_gradient(parts, tmp_path, capsys) -> None:
    rng, graph, x = parts
    layer = TransformerConv(4, 3, heads=2, root_weight=False)
    arrays = write_file(
        tmp_path / "f.npz", layer, layer.init_params(rng), x, graph, framework="pyg"
    )
    assert "param/lin_skip.weight" in arrays  # PyG builds it regardless
    for key in ("grad/param/lin_skip.weight", "grad/param/lin_skip.bias"):
        del arrays[key]  # named_parameters() gives it no gradient (never used)
    np.savez(tmp_path / "g.npz", **arrays)
    assert main(["crosscheck", str(tmp_path / "g.npz")]) == 0
    printed = capsys.readouterr().out
    assert "note: grad/param/lin_skip.weight: not compared" in printed
    assert "grad/param/W_q" in printed


def test_pre_2_7_transformer_biases_under_bias_false_are_set_aside(parts, tmp_path, capsys):
    # PyG < 2.7 kept lin_{key,query,value}.bias under bias=False: zero values, but used, so
    # their gradients are not zero
    rng, graph, x = parts
    layer = TransformerConv(4, 3, heads=2, bias=False)
    params = layer.init_params(rng)
    old = to_pyg(layer, params, pyg_version="2.6")
    extra = {}
    for lin in ("lin_key", "lin_query", "lin_value"):
        extra[f"param/{lin}.bias"] = old[f"{lin}.bias"]
        extra[f"grad/param/{lin}.bias"] = rng.standard_normal(old[f"{lin}.bias"].shape)
    write_file(tmp_path / "f.npz", layer, params, x, graph, framework="pyg", **extra)
    assert main(["crosscheck", str(tmp_path / "f.npz")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 3 and all("not compared" in note for note in notes)


def test_a_twin_takes_its_gradient_from_the_name_present(parts, tmp_path, capsys) -> None:
    # PyG 2.0-2.4's GATConv: lin_dst is lin_src, listed once by named_parameters()
    rng, graph, x = parts
    layer = GATConv(4, 3, heads=2)
    params = layer.init_params(rng)
    arrays = write_file(tmp_path / "f.npz", layer, params, x, graph)
    _, cache = layer.forward(params, x, graph)
    _, d_params = layer.backward(params, cache, arrays["cotangent"])
    kwargs = {"in_channels": 4, "out_channels": 3, "heads": 2}
    common = {k: v for k, v in arrays.items() if not k.startswith(("param/", "grad/param/"))}
    common["config"] = np.array(
        json.dumps({"framework": "pyg", "layer": "GATConv", "kwargs": kwargs})
    )
    common |= {f"param/{k}": v for k, v in to_pyg(layer, params, pyg_version="2.4").items()}
    assert "param/lin_dst.weight" in common

    def file_with(drop: str, scale: float) -> Path:
        grads = to_pyg(layer, d_params, pyg_version="2.4")
        del grads[drop]
        twin = "lin_src.weight" if drop == "lin_dst.weight" else "lin_dst.weight"
        grads[twin] = grads[twin] * scale
        path = tmp_path / f"{drop}-{scale}.npz"
        np.savez(path, **common, **{f"grad/param/{k}": v for k, v in grads.items()})
        return path

    for drop in ("lin_dst.weight", "lin_src.weight"):
        assert main(["crosscheck", str(file_with(drop, 1.0))]) == 0, capsys.readouterr().out
        # the twin's gradient is compared, not hidden: a wrong one fails
        assert main(["crosscheck", str(file_with(drop, 1 + 1e-6))]) == 1


def test_real_pyg_gatv2_with_shared_weights_and_biases(tmp_path, capsys) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GATv2Conv

    torch.manual_seed(0)
    conv = GATv2Conv(5, 3, heads=2, share_weights=True).double().eval()
    with torch.no_grad():  # a trained module's biases: lin_l's (lin_r is lin_l) and the output's
        torch.nn.init.normal_(conv.lin_l.bias)
        torch.nn.init.normal_(conv.bias)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]])
    out = conv(x, edge_index)
    cotangent = torch.randn_like(out)
    (out * cotangent).sum().backward()
    named = dict(conv.named_parameters())
    assert "lin_r.weight" not in named and "lin_r.weight" in conv.state_dict()
    config = {
        "framework": "pyg",
        "layer": "GATv2Conv",
        "kwargs": {"in_channels": 5, "out_channels": 3, "heads": 2, "share_weights": True},
    }
    np.savez(
        tmp_path / "f.npz",
        config=json.dumps(config),
        **{
            "input/x": x.detach().numpy(),
            "input/edge_index": edge_index.numpy(),
            "output/out": out.detach().numpy(),
            "cotangent": cotangent.numpy(),
            "grad/input/x": x.grad.numpy(),
        },
        **{f"param/{k}": v.numpy() for k, v in conv.state_dict().items()},
        **{f"grad/param/{k}": p.grad.numpy() for k, p in named.items()},
    )
    assert main(["crosscheck", str(tmp_path / "f.npz")]) == 0
    printed = capsys.readouterr().out
    for name in ("grad/param/W_s", "grad/param/b_s", "grad/param/att", "grad/param/bias"):
        assert name in printed  # lin_l.bias as b_s: GATv2Conv(bias=True) has projection biases
    assert "not compared" not in printed


@pytest.mark.parametrize(
    ("rtol", "message"),
    [
        ("nan", "argument --rtol: must be a finite number, got nan"),
        ("inf", "argument --rtol: must be a finite number, got inf"),
        ("-1", "argument --rtol: must be a finite number >= 0, got -1"),
        ("1e-3x", "argument --rtol: must be a number, got '1e-3x'"),
    ],
)
def test_crosscheck_rtol_nan_is_refused(rtol, message, parts, tmp_path, capsys) -> None:
    # --rtol was type=float: nan and -1 were accepted and failed every tensor (`error <= rtol`
    # is False), inf passed any file. Tests only gave sensible tolerances or none.
    gat_file(tmp_path / "f.npz", parts)
    with pytest.raises(SystemExit) as exited:
        main(["crosscheck", str(tmp_path / "f.npz"), "--rtol", rtol])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert main(["crosscheck", str(tmp_path / "f.npz"), "--rtol", "0"]) == 0  # ours: exact


@pytest.mark.parametrize("rtol", [math.nan, -1.0, math.inf])
def test_crosscheck_function_refuses_a_nan_rtol(rtol, parts, tmp_path) -> None:
    # The library call had no check either: crosscheck(path, rtol=nan) failed every tensor.
    gat_file(tmp_path / "f.npz", parts)
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        crosscheck(tmp_path / "f.npz", rtol=rtol)


def test_a_bipartite_pyg_file_passes_and_a_perturbed_one_fails(tmp_path, capsys) -> None:
    # the README's export with x = (x_src, x_dst): input/x_src, input/x_dst and their
    # gradients in place of input/x, in_channels a 2-list
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GATv2Conv

    torch.manual_seed(0)
    conv = GATv2Conv((5, 4), 3, heads=2, edge_dim=2, residual=True).double().eval()
    with torch.no_grad():
        for parameter in conv.parameters():
            parameter.normal_()
    x_src = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    x_dst = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 0, 1, 2, 0, 0]])
    edge_attr = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    out = conv((x_src, x_dst), edge_index, edge_attr)
    cotangent = torch.randn_like(out)
    (out * cotangent).sum().backward()
    kwargs = {"in_channels": [5, 4], "out_channels": 3, "heads": 2, "edge_dim": 2,
              "residual": True}  # fmt: skip
    arrays = {
        "config": json.dumps({"framework": "pyg", "layer": "GATv2Conv", "kwargs": kwargs}),
        "input/x_src": x_src.detach().numpy(),
        "input/x_dst": x_dst.detach().numpy(),
        "input/edge_index": edge_index.numpy(),
        "input/edge_attr": edge_attr.detach().numpy(),
        "output/out": out.detach().numpy(),
        "cotangent": cotangent.numpy(),
        "grad/input/x_src": x_src.grad.numpy(),
        "grad/input/x_dst": x_dst.grad.numpy(),
        "grad/input/edge_attr": edge_attr.grad.numpy(),
        **{f"param/{k}": v.numpy() for k, v in conv.state_dict().items()},
        **{f"grad/param/{k}": p.grad.numpy() for k, p in conv.named_parameters()},
    }
    np.savez(tmp_path / "f.npz", **arrays)
    assert main(["crosscheck", str(tmp_path / "f.npz")]) == 0
    printed = capsys.readouterr().out
    assert "grad/input/x_src" in printed and "grad/input/x_dst" in printed
    arrays["output/out"] = arrays["output/out"] * (1 + 1e-6)
    np.savez(tmp_path / "g.npz", **arrays)
    assert main(["crosscheck", str(tmp_path / "g.npz")]) == 1
