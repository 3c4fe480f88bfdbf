"""examples/jax_replay.py: an independent JAX GATConv replays the golden vectors with
``jax.vjp`` and agrees with every GATConv case, edge features included (every ``fill_value``,
ties and zeros among the fill's inputs too); a gradient perturbed by 1e-6 fails; an option it
does not implement is skipped, not failed; a directory it cannot read exits 2 in one line.
Skipped without JAX (an optional extra)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from refimpl import Graph
from refimpl.interop.golden import export_golden
from refimpl.nn import GATConv

pytest.importorskip("jax")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_replay.py"


@pytest.fixture(scope="module")
def replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jax_replay", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export of every case (GATConv and others), shared read-only."""
    directory = tmp_path_factory.mktemp("golden") / "all"
    export_golden(directory)
    return directory


@pytest.fixture
def copy(golden: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(golden, tmp_path / "golden"))


def run(replay: ModuleType, capsys: pytest.CaptureFixture, *args: object) -> tuple[int, dict, str]:
    """Exit status, ``{(case, tensor): (max rel err, "pass" | "FAIL")}`` and the output."""
    code = replay.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    rows = {}
    for line in captured.out.splitlines()[1:]:
        fields = line.split()
        if len(fields) == 5 and fields[4] in ("pass", "FAIL"):
            rows[fields[0], fields[1]] = (float(fields[2]), fields[4])
    return code, rows, captured.out + captured.err


def skipped_of(output: str) -> dict[str, str]:
    """``{case: reason}`` of the rows ``<case>  skipped: <reason>``."""
    rows = (line.split("  skipped: ") for line in output.splitlines())
    return {row[0].strip(): row[1] for row in rows if len(row) == 2}


def gatconv_entries(directory: Path) -> list[dict]:
    manifest = json.loads((directory / "manifest.json").read_text())
    return [entry for entry in manifest["cases"] if entry["class"] == "GATConv"]


def test_every_gatconv_case_replays_and_passes(replay, golden, capsys) -> None:
    code, rows, output = run(replay, capsys, golden)
    assert code == 0, output
    replayed = gatconv_entries(golden)  # all of them: none is skipped
    assert {entry["config"]["version"] for entry in replayed} == {"v1", "v2"}
    with_edge_features = [e for e in replayed if e["config"].get("edge_dim") is not None]
    assert {entry["config"]["version"] for entry in with_edge_features} == {"v1", "v2"}
    for entry in replayed:
        with np.load(golden / entry["file"]) as archive:
            tensors = [key for key in archive.files if key.startswith(("output/", "grad/"))]
        for tensor in tensors:
            assert rows[entry["name"], tensor][1] == "pass", output
    assert {case for case, _ in rows} == {entry["name"] for entry in replayed}  # GATConv only
    assert not skipped_of(output)
    assert output.rstrip().splitlines()[-1].startswith("PASS:")


def add_case(directory: Path, name: str, edge_attr: np.ndarray | None = None, **config) -> None:
    """A GATConv case the canonical export lacks, written by refimpl's layer in the golden
    format, on the graph of the case ``gatconv_v1`` (10 edges on 6 nodes, with a self-loop
    at node 4, a duplicate edge 1 -> 2 and no edge into node 5); with ``edge_dim``, on the
    features ``edge_attr`` (10, edge_dim), standard normals unless given."""
    layer = GATConv(in_channels=4, out_channels=3, heads=2, **config)
    rng = np.random.default_rng(7)
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in layer.init_params(rng).items()}
    with np.load(directory / "gatconv_v1.npz") as archive:
        edge_index, num_nodes = archive["input/edge_index"], archive["input/num_nodes"]
    x = rng.standard_normal((int(num_nodes), 4))
    arrays = {"input/x": x, "input/edge_index": edge_index, "input/num_nodes": num_nodes}
    array_kwargs = {}
    if layer.edge_dim is not None:
        if edge_attr is None:
            edge_attr = rng.standard_normal((edge_index.shape[1], layer.edge_dim))
        arrays["input/edge_attr"] = edge_attr
        array_kwargs["edge_attr"] = "input/edge_attr"
    out, cache = layer.forward(params, x, Graph(edge_index, int(num_nodes)), edge_attr=edge_attr)
    cotangent = rng.standard_normal(out.shape)
    d_inputs, d_params = layer.backward(params, cache, cotangent)
    if layer.edge_dim is None:
        arrays["grad/input/x"] = d_inputs
    else:
        arrays["grad/input/x"], arrays["grad/input/edge_attr"] = d_inputs
    arrays |= {f"param/{k}": v for k, v in params.items()}
    arrays |= {"cotangent": cotangent, "output/out": out}
    arrays |= {f"grad/param/{k}": v for k, v in d_params.items()}
    np.savez(directory / f"{name}.npz", **arrays)
    manifest = json.loads((directory / "manifest.json").read_text())
    forward = {"args": ["input/x", "graph"], "array_kwargs": array_kwargs, "kwargs": {},
               "noise_kwarg": None}  # fmt: skip
    manifest["cases"].append(
        {
            "name": name,
            "file": f"{name}.npz",
            "class": "GATConv",
            "config": dataclasses.asdict(layer),
            "forward": forward,
        }
    )
    (directory / "manifest.json").write_text(json.dumps(manifest))


PROJECTION_BIAS = pytest.mark.skipif(
    "projection_bias" not in {f.name for f in dataclasses.fields(GATConv)},
    reason="this refimpl's GATConv has no projection_bias",
)


@pytest.mark.parametrize(
    "config",
    [
        {"residual": True, "add_self_loops": False},
        {"version": "v2", "concat": False, "residual": True, "bias": False},
        pytest.param({"version": "v2", "projection_bias": True}, marks=PROJECTION_BIAS),
        pytest.param(
            {"version": "v2", "projection_bias": True, "share_weights": True, "concat": False},
            marks=PROJECTION_BIAS,
        ),
    ],
    ids=["v1 residual no loops", "v2 mean residual no bias", "v2 b_s b_t", "v2 shared b_s"],
)
def test_options_the_canonical_cases_lack_replay(replay, copy, capsys, config) -> None:
    add_case(copy, "extra", **config)
    code, rows, output = run(replay, capsys, copy, "--case", "extra")
    assert code == 0, output
    with np.load(copy / "extra.npz") as archive:
        stored = {key for key in archive.files if key.startswith(("output/", "grad/"))}
    assert {tensor for _, tensor in rows} == stored  # every parameter's gradient compared


# (version, fill_value) with self-loops: every fill_value once, each version with a sum, an
# extreme, a constant; the golden export adds v1 "mean" and v2 "max" on plain random
# features. The fill is computed before the version's score, the same for both, so no full
# product (each case costs one XLA compile, ~0.3 s).
FILLS_WITH_LOOPS = [
    ("v1", "add"),
    ("v1", "min"),
    ("v1", "mul"),
    ("v1", [0.5, -1.0, 2.0]),
    ("v2", "mean"),
    ("v2", "max"),
    ("v2", 0.75),
    ("v2", None),
]


def tied_and_zero_features(rng: np.random.Generator) -> np.ndarray:
    """(10, 3) features on ``add_case``'s graph where the fill's reductions meet their edge
    cases: into node 2 (edges 2, 5 and the duplicate 6) feature 0 has a tied max and feature
    1 a tied min; into node 1 (edges 0, 3) feature 0 has one zero factor, into node 0
    (edges 1, 9) feature 1 two; the self-loop's row (edge 7) is dropped, and nodes 4 and 5
    have no other incoming edge."""
    edge_attr = rng.standard_normal((10, 3))
    edge_attr[[2, 6, 5], 0] = [3.0, 3.0, 0.5]  # max 3 attained twice
    edge_attr[[2, 6, 5], 1] = [-3.0, -3.0, -0.5]  # min -3 attained twice
    edge_attr[0, 0] = 0.0
    edge_attr[[1, 9], 1] = 0.0
    return edge_attr


def test_edge_features_with_every_fill_value_replay(replay, copy, capsys) -> None:
    """``edge_dim=3`` with each fill_value and self-loops, on features with ties and zeros
    where the fill reduces; and v1 and v2 without self-loops, where the features are used as
    given (the self-loop's row included; fill_value is then not read)."""
    edge_attr = tied_and_zero_features(np.random.default_rng(3))
    with np.load(copy / "gatconv_v1.npz") as archive:  # add_case's graph, as described
        src, dst = archive["input/edge_index"]
    assert [(src[e], dst[e]) for e in (2, 6, 5, 0, 3, 1, 9, 7)] == [
        (1, 2), (1, 2), (3, 2), (0, 1), (2, 1), (1, 0), (3, 0), (4, 4)
    ]  # fmt: skip
    assert sorted(set(dst[src != dst])) == [0, 1, 2, 3]
    names = []
    for i, (version, fill_value) in enumerate(FILLS_WITH_LOOPS):
        names.append(f"{version}_fill_{i}")
        add_case(copy, names[-1], edge_attr, version=version, edge_dim=3, fill_value=fill_value)
    for version in ("v1", "v2"):
        names.append(f"{version}_no_loops")
        add_case(copy, names[-1], edge_attr, version=version, edge_dim=3, fill_value="max",
                 add_self_loops=False, residual=True)  # fmt: skip
    code, rows, output = run(replay, capsys, copy, "--case", *names)
    assert code == 0, output
    assert not skipped_of(output)
    for name in names:
        with np.load(copy / f"{name}.npz") as archive:
            stored = {key for key in archive.files if key.startswith(("output/", "grad/"))}
        assert "grad/input/edge_attr" in stored and "grad/param/W_e" in stored
        assert {tensor for case, tensor in rows if case == name} == stored, output
    assert all(verdict == "pass" for _, verdict in rows.values()), output


@pytest.mark.parametrize(
    ("case", "tensor"),
    [
        ("gatconv_v2_separate", "grad/param/W_t"),
        ("gatconv_v1_edge_features", "grad/input/edge_attr"),
    ],
    ids=["a parameter's", "the edge features'"],
)
def test_a_gradient_perturbed_by_1e_6_fails(replay, copy, capsys, case, tensor) -> None:
    path = copy / f"{case}.npz"
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays[tensor] = arrays[tensor] * (1 + 1e-6)
    np.savez(path, **arrays)  # the script reads the manifest's file names, not their SHA-256
    code, rows, output = run(replay, capsys, copy, "--case", case)
    assert code == 1, output
    error, verdict = rows[case, tensor]
    assert verdict == "FAIL" and error == pytest.approx(1e-6, rel=1e-3)
    assert [t for (_, t), (_, v) in rows.items() if v == "FAIL"] == [tensor]
    assert output.rstrip().splitlines()[-1].startswith("FAIL: 1 tensor(s) disagree")


def test_an_option_not_implemented_is_skipped(replay, copy, capsys) -> None:
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = next(entry for entry in manifest["cases"] if entry["name"] == "gatconv_v1")
    entry["config"] |= {"temperature": 2.0}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, rows, output = run(replay, capsys, copy, "--case", "gatconv_v1", "gatconv_v2_shared")
    assert code == 0, output
    assert skipped_of(output) == {"gatconv_v1": "options not implemented here: temperature=2.0"}
    assert {case for case, _ in rows} == {"gatconv_v2_shared"}
    # nothing replayed checks nothing: that must not pass
    code, rows, output = run(replay, capsys, copy, "--case", "gatconv_v1")
    assert code == 1 and not rows and "FAIL: no case replayed" in output


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ({"fill_value": "median"}, "fill_value='median'"),
        ({"fill_value": [1.0, 2.0, 3.0]}, "fill_value has 3 numbers for edge_dim=2"),
        ({"fill_value": True}, "fill_value=True"),
        ({"edge_dim": 0}, "edge_dim=0"),
        (
            {"lipschitz_norm": "paper"},
            "lipschitz_norm with edge_dim (refimpl's layer refuses the combination)",
        ),
    ],
    ids=["an unknown fill", "too many numbers", "a bool", "no features", "with LipschitzNorm"],
)
def test_edge_features_it_cannot_replay_say_why(replay, golden, option, reason) -> None:
    """The skip reasons of edge-feature cases (how a skip is reported: the test above)."""
    entry = next(e for e in gatconv_entries(golden) if e["name"] == "gatconv_v1_edge_features")
    assert replay.configuration(entry)[1] == ""
    assert replay.configuration({**entry, "config": entry["config"] | option})[1] == reason
    without_array = {**entry, "forward": {**entry["forward"], "array_kwargs": {}}}
    assert "without an edge_attr array" in replay.configuration(without_array)[1]


def test_a_directory_it_cannot_read_exits_2_in_one_line(replay, golden, tmp_path, capsys) -> None:
    for args, message in [
        ([tmp_path / "absent"], "is not a directory"),
        ([tmp_path], "no manifest.json"),
        ([golden, "--case", "pairnorm_pn"], "no GATConv case pairnorm_pn"),
    ]:
        code, rows, output = run(replay, capsys, *args)
        assert code == 2 and not rows, output
        assert message in output and len(output.strip().splitlines()) == 1, output


def test_without_jax_it_says_so_in_one_line(tmp_path) -> None:
    hide_jax = "import runpy, sys; sys.modules['jax'] = None; runpy.run_path(sys.argv[1])"
    result = subprocess.run(
        [sys.executable, "-c", hide_jax, str(EXAMPLE), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "needs JAX" in result.stderr and "pip install jax" in result.stderr
