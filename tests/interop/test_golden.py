"""Golden vectors: export then verify, the files checked against finite differences by an
independent reader of the documented format, tampering and broken directories refused with a
message, a perturbed implementation caught, deterministic export."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import refimpl.models
import refimpl.nn
from refimpl import Graph
from refimpl.cli import main
from refimpl.interop.golden import GRADIENT_RTOL, export_golden, verify_golden
from refimpl.interop.golden_cases import GOLDEN_CASES, REGISTRY
from refimpl.interop.golden_format import MANIFEST_NAME, GoldenError
from refimpl.nn import GATConv
from refimpl.testing.tolerances import GRADCHECK_RTOL


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export of every case, shared read-only; tests that alter files work on a copy."""
    directory = tmp_path_factory.mktemp("golden") / "all"
    export_golden(directory)
    return directory


@pytest.fixture
def copy(golden: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(golden, tmp_path / "golden"))


def manifest_of(directory: Path) -> dict:
    return json.loads((directory / MANIFEST_NAME).read_text())


def load(directory: Path, entry: dict) -> dict[str, np.ndarray]:
    with np.load(directory / entry["file"], allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["golden", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the round trip ------------------------------------------------------------------------------
def test_export_then_verify_passes_every_case(golden: Path, capsys) -> None:
    results = verify_golden(golden)
    assert [name for name, _ in results] == list(GOLDEN_CASES)
    failed = [(name, c.table(name)) for name, c in results if not c.passed]
    assert not failed, failed
    code, out, _ = run_cli(capsys, "verify", str(golden))
    assert code == 0
    assert f"PASS: all {len(GOLDEN_CASES)} cases agree" in out
    assert out.count("max rel err") == len(GOLDEN_CASES)  # one table per case


def test_every_layer_and_model_has_a_case(golden: Path) -> None:
    # A new layer following the protocol must join REGISTRY and get a case. The exceptions:
    # NodeFormerEdgeLoss reads a NodeFormerConv cache, not arrays; GTAttention, GTLayer and
    # GraphiTAttention return two streams (h, e) and take a pair of cotangents, and BatchNorm
    # and PairAttention read dicts (running statistics; projections by name), which the
    # one-array format does not hold: the graph_transformer_gt / _graphit cases and the
    # transformer_stream cases run each of them inside a block that has one output.
    two_streams_or_dicts = {
        "GTAttention",
        "GTLayer",
        "GraphiTAttention",
        "BatchNorm",
        "PairAttention",
    }
    protocol = {
        name
        for module in (refimpl.nn, refimpl.models)
        for name in module.__all__
        if dataclasses.is_dataclass(obj := getattr(module, name))
        and inspect.isclass(obj)
        and hasattr(obj, "forward")
        and hasattr(obj, "backward")
    }
    assert protocol - {"NodeFormerEdgeLoss"} - two_streams_or_dicts == set(REGISTRY)
    assert {entry["class"] for entry in manifest_of(golden)["cases"]} == set(REGISTRY)


def test_shapes_and_dtypes_round_trip_against_the_manifest(golden: Path) -> None:
    manifest = manifest_of(golden)
    assert [entry["name"] for entry in manifest["cases"]] == list(GOLDEN_CASES)
    for entry in manifest["cases"]:
        arrays = load(golden, entry)
        listed = entry["arrays"]
        assert list(arrays) == list(listed), entry["name"]
        for key, value in arrays.items():
            assert list(value.shape) == listed[key]["shape"], (entry["name"], key)
            assert str(value.dtype) == listed[key]["dtype"], (entry["name"], key)
            if key in ("input/edge_index", "input/num_nodes", "input/batch"):
                allowed = {"int64"}
            elif key.startswith("noise/"):
                allowed = {"float64", "bool"}  # projections and Gumbel noise; keep-masks
            elif key in ("input/real", "input/valid"):
                allowed = {"bool"}  # which pairs are edges, which eigenpairs exist
            else:
                allowed = {"float64"}
            assert str(value.dtype) in allowed, (entry["name"], key)
        # every gradient is shaped like what it differentiates; the cotangent like the output
        for key in (k for k in arrays if k.startswith("grad/")):
            assert arrays[key].shape == arrays[key.removeprefix("grad/")].shape, key
        assert arrays["cotangent"].shape == arrays["output/out"].shape
        assert entry["grad_inputs"] == [
            k.removeprefix("grad/") for k in arrays if k.startswith("grad/input/")
        ]
        # the config rebuilds the block, holds init fields only, and its parameters are stored
        block = REGISTRY[entry["class"]](**entry["config"])
        init_fields = [f.name for f in dataclasses.fields(block) if f.init]
        assert list(entry["config"]) == init_fields, entry["name"]
        shapes = block.param_shapes() if hasattr(block, "param_shapes") else {}
        params = {k: v.shape for k, v in arrays.items() if k.startswith("param/")}
        assert params == {f"param/{k}": tuple(v) for k, v in shapes.items()}, entry["name"]
        assert entry["sha256"] == hashlib.sha256((golden / entry["file"]).read_bytes()).hexdigest()


def test_models_record_no_derived_fields(golden: Path) -> None:
    configs = {entry["name"]: entry["config"] for entry in manifest_of(golden)["cases"]}
    assert "layers" not in configs["gat_model"] and configs["gat_model"]["heads"] == [2, 1]
    assert not {"convs", "blocks"} & set(configs["nodeformer_model"])
    assert "blocks" not in configs["graph_transformer_model"]


# -- the files are right, read as another framework would ------------------------------------
def replay_loss(entry: dict, arrays: dict[str, np.ndarray]) -> float:
    """``L = sum(cotangent * out)`` from the manifest's description alone (the module docstring's
    replay recipe), not through the exporter's code."""
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in entry["config"].items()}
    block = REGISTRY[entry["class"]](**config)
    spec = entry["forward"]
    graph = None
    if "input/edge_index" in arrays:
        graph = Graph(arrays["input/edge_index"], int(arrays["input/num_nodes"]))
    args = [graph if key == "graph" else arrays[key] for key in spec["args"]]
    kwargs = dict(spec["kwargs"])
    kwargs.update({name: arrays[key] for name, key in spec["array_kwargs"].items()})
    if spec["noise_kwarg"]:
        kwargs[spec["noise_kwarg"]] = {
            k.removeprefix("noise/"): v for k, v in arrays.items() if k.startswith("noise/")
        }
    params = {k.removeprefix("param/"): v for k, v in arrays.items() if k.startswith("param/")}
    out, _ = block.forward(params, *args, **kwargs)
    return float(np.sum(arrays["cotangent"] * out))


def test_stored_gradients_match_central_differences_of_the_stored_loss(golden: Path) -> None:
    # The golden gradients are checked against finite differences of L = sum(c * out), with
    # the inputs, parameters and noise read back from the files: what verify compares
    # against is itself the gradient of the documented loss.
    eps, rng, worst = 1e-6, np.random.default_rng(0), {}
    for entry in manifest_of(golden)["cases"]:
        arrays = load(golden, entry)
        grads = {k: v for k, v in arrays.items() if k.startswith("grad/")}
        scale = max(float(np.max(np.abs(g))) for g in grads.values())
        errors = []
        for key, grad in grads.items():
            target = key.removeprefix("grad/")
            for flat in rng.choice(grad.size, size=min(3, grad.size), replace=False):
                index = np.unravel_index(flat, grad.shape)
                sides = []
                for step in (eps, -eps):
                    shifted = dict(arrays)
                    shifted[target] = arrays[target].copy()
                    shifted[target][index] += step
                    sides.append(replay_loss(entry, shifted))
                numeric = (sides[0] - sides[1]) / (2 * eps)
                errors.append(abs(numeric - grad[index]) / scale)
        worst[entry["name"]] = max(errors)
    assert max(worst.values()) <= GRADCHECK_RTOL, worst


def test_the_output_replays_exactly_from_the_recorded_noise(golden: Path) -> None:
    # Noise is stored, not redrawn: replaying from the files alone gives the stored output.
    for entry in manifest_of(golden)["cases"]:
        arrays = load(golden, entry)
        expected = float(np.sum(arrays["cotangent"] * arrays["output/out"]))
        assert replay_loss(entry, arrays) == pytest.approx(expected, rel=1e-13), entry["name"]


# -- broken directories: a message, a non-zero exit, no traceback ---------------------------------
def assert_refused(code: int, out: str, err: str, *phrases: str) -> None:
    assert code == 2
    assert "Traceback" not in out + err
    assert err.startswith("refimpl golden: error:")
    for phrase in phrases:
        assert phrase in err, err


def test_one_ulp_change_in_a_file_is_reported_altered(copy: Path, capsys) -> None:
    path = copy / "gatconv_v2_separate.npz"
    content = bytearray(path.read_bytes())
    with np.load(path) as archive:
        first_output = archive["output/out"].tobytes()[:8]
    offset = bytes(content).index(first_output)  # the first output value's 8 bytes
    content[offset] ^= 1  # its lowest mantissa bit: one value changed by one ulp
    path.write_bytes(bytes(content))
    assert_refused(
        *run_cli(capsys, "verify", str(copy)), "gatconv_v2_separate.npz: altered", "SHA-256"
    )


def test_a_resaved_value_is_reported_altered(copy: Path, capsys) -> None:
    path = copy / "layernorm_node.npz"
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays["param/weight"][0] += 1.0
    np.savez(path, **arrays)
    assert_refused(*run_cli(capsys, "verify", str(copy)), "layernorm_node.npz: altered")


def test_a_missing_file_is_reported(copy: Path, capsys) -> None:
    (copy / "gat_model.npz").unlink()
    (copy / "pairnorm_pn.npz").unlink()
    code, out, err = run_cli(capsys, "verify", str(copy))
    assert_refused(code, out, err, "gat_model.npz: missing", "pairnorm_pn.npz: missing")
    with pytest.raises(GoldenError, match="2 golden file"):
        verify_golden(copy)
    # a verify of the other cases still runs
    assert verify_golden(copy, ["layernorm_graph"])[0][1].passed


def test_a_corrupted_manifest_is_reported(copy: Path, capsys) -> None:
    manifest = copy / MANIFEST_NAME
    manifest.write_text(manifest.read_text()[:-200])
    assert_refused(*run_cli(capsys, "verify", str(copy)), "is not valid JSON")
    manifest.write_text(json.dumps({"format": "refimpl-golden", "format_version": 1}))
    assert_refused(*run_cli(capsys, "verify", str(copy)), "'cases' must be a list")
    manifest.unlink()
    assert_refused(*run_cli(capsys, "verify", str(copy)), "no manifest.json")
    assert_refused(*run_cli(capsys, "verify", str(copy / "absent")), "not a directory")


def test_an_unknown_class_or_an_escaping_file_name_is_refused(copy: Path, capsys) -> None:
    manifest = manifest_of(copy)
    manifest["cases"][0]["class"] = "Popen"
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert_refused(*run_cli(capsys, "verify", str(copy)), "unknown class 'Popen'")
    manifest["cases"][0]["file"] = "../elsewhere.npz"
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert_refused(*run_cli(capsys, "verify", str(copy)), "plain names")


def test_a_file_that_disagrees_with_its_manifest_entry_is_refused(copy: Path, capsys) -> None:
    # the checksum matches (both were edited): the listed arrays and the zip itself are checked
    manifest = manifest_of(copy)
    entry = next(e for e in manifest["cases"] if e["name"] == "pairnorm_pn")
    entry["arrays"]["input/x"]["shape"] = [6, 4]
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    message = "does not match the manifest's list of arrays at input/x"
    assert_refused(*run_cli(capsys, "verify", str(copy), "--case", "pairnorm_pn"), message)
    path = copy / "layernorm_graph.npz"
    path.write_bytes(b"not a zip")
    entry = next(e for e in manifest["cases"] if e["name"] == "layernorm_graph")
    entry["sha256"] = hashlib.sha256(b"not a zip").hexdigest()
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    message = "layernorm_graph.npz is not a readable .npz"
    assert_refused(*run_cli(capsys, "verify", str(copy), "--case", "layernorm_graph"), message)


def test_an_unknown_case_name_is_refused(golden: Path, tmp_path: Path, capsys) -> None:
    assert_refused(*run_cli(capsys, "verify", str(golden), "--case", "gatconv_v3"), "gatconv_v3")
    assert_refused(*run_cli(capsys, "export", str(tmp_path / "new"), "--case", "x"), "unknown case")


# -- a wrong implementation fails with the table ---------------------------------------------------
def test_a_perturbed_forward_fails_with_the_mismatch_table(
    golden: Path, monkeypatch, capsys
) -> None:
    original = GATConv.forward_unchecked  # behind GATConv.forward and the models' layer calls

    def shifted(self, *args, **kwargs):  # out + 1e-9: far below any visible difference
        out, cache = original(self, *args, **kwargs)
        return out + 1e-9, cache

    monkeypatch.setattr(GATConv, "forward_unchecked", shifted)
    code, out, err = run_cli(capsys, "verify", str(golden), "--case", "gatconv_v1")
    assert code == 1 and "Traceback" not in out + err
    rows = {
        line.split()[0]: line for line in out.splitlines() if line.startswith(("output", "grad"))
    }
    assert rows["output/out"].endswith("NO")
    assert all(row.endswith("yes") for name, row in rows.items() if name.startswith("grad/"))
    assert "FAIL: 1 of 1 cases disagree: gatconv_v1" in out
    # the models built on GATConv fail too
    results = dict(verify_golden(golden, ["gat_model", "pairnorm_pn"]))
    assert not results["gat_model"].passed and results["pairnorm_pn"].passed


def test_a_perturbed_gradient_fails(golden: Path, monkeypatch) -> None:
    original = GATConv.backward

    def shifted(self, *args, **kwargs):
        d_x, d_params = original(self, *args, **kwargs)
        return d_x, {name: grad + 1e-9 for name, grad in d_params.items()}

    monkeypatch.setattr(GATConv, "backward", shifted)
    [(_, comparison)] = verify_golden(golden, ["gatconv_v2_shared"])
    failed = {t.name for t in comparison.tensors if not t.passed}
    assert failed == {f"grad/param/{name}" for name in ("W_s", "att", "bias")}
    assert all(t.max_rel_error > GRADIENT_RTOL for t in comparison.tensors if t.name in failed)


def test_a_changed_reference_value_with_a_matching_checksum_fails(copy: Path, capsys) -> None:
    # Someone edits a value and updates the checksum: the recomputation still catches it.
    entry = next(e for e in manifest_of(copy)["cases"] if e["name"] == "transformerconv")
    path = copy / entry["file"]
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays["grad/param/W_v"][1, 2] *= 1 + 1e-8
    np.savez(path, **arrays)
    manifest = manifest_of(copy)
    for item in manifest["cases"]:
        if item["name"] == "transformerconv":
            item["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    code, out, _ = run_cli(capsys, "verify", str(copy))
    assert code == 1
    assert f"FAIL: 1 of {len(GOLDEN_CASES)} cases disagree: transformerconv" in out
    assert any(
        line.startswith("grad/param/W_v") and line.endswith("NO") for line in out.split("\n")
    )


# -- export ----------------------------------------------------------------------------------------
def test_export_is_deterministic(golden: Path, tmp_path: Path, capsys) -> None:
    assert run_cli(capsys, "export", str(tmp_path / "again"))[0] == 0
    for entry in manifest_of(golden)["cases"]:
        assert (golden / entry["file"]).read_bytes() == (
            tmp_path / "again" / entry["file"]
        ).read_bytes()
    assert (golden / MANIFEST_NAME).read_bytes() == (
        tmp_path / "again" / MANIFEST_NAME
    ).read_bytes()


def test_export_refuses_a_non_empty_directory_unless_forced(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    case = ["--case", "layernorm_node", "--case", "pairnorm_pn_si"]
    assert_refused(*run_cli(capsys, "export", str(tmp_path), *case), "not empty", "--force")
    assert not (tmp_path / MANIFEST_NAME).exists()
    code, out, _ = run_cli(capsys, "export", str(tmp_path), *case, "--force")
    assert code == 0 and "wrote 2 cases" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "layernorm_node.npz",
        MANIFEST_NAME,
        "notes.txt",
        "pairnorm_pn_si.npz",
    ]
    # the canonical order, whatever the order asked
    assert [e["name"] for e in manifest_of(tmp_path)["cases"]] == [
        "pairnorm_pn_si",
        "layernorm_node",
    ]
    assert run_cli(capsys, "verify", str(tmp_path))[0] == 0


def test_golden_manifest_with_an_empty_case_list_is_refused(copy: Path, capsys) -> None:
    # `golden verify` of a manifest listing no case printed "PASS: all 0 cases agree" and
    # exited 0: a verification that checks nothing passed. Every earlier test kept the cases.
    manifest = manifest_of(copy)
    manifest["cases"] = []
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    code, out, err = run_cli(capsys, "verify", str(copy))
    assert_refused(code, out, err, "'cases' must be a list of one or more", "verify nothing")
    assert "PASS" not in out and err.count("\n") == 1
    with pytest.raises(GoldenError, match="would verify nothing"):
        verify_golden(copy)


def drop(mapping: dict, key: str) -> None:
    del mapping[key]


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        (lambda m: drop(m, "refimpl_version"), "'refimpl_version' must be a string, got None"),
        (lambda m: m.update(loss=1), "'loss' must be a string"),
        (lambda m: m.update(tolerances={"output_rtol": -1}), "'tolerances' must be an object"),
        (lambda m: m["cases"].append(m["cases"][0]), "is listed twice"),
        (lambda m: m["cases"].append("gat"), "(None) must be an object with the fields"),
        (
            lambda m: m["cases"][1].update(sha256="abc"),
            "case 1 ('gatconv_v1_mean_no_self_loops') has sha256",
        ),
        (lambda m: m["cases"][0].update(forward=[]), "has a malformed 'forward'"),
        (lambda m: m["cases"][0]["forward"].update(args="x"), "has a malformed 'forward'"),
        (lambda m: m["cases"][0].update(grad_inputs="input/x"), "malformed 'grad_inputs'"),
        (lambda m: m["cases"][0].update(config=[1]), "needs a class name"),
        (
            lambda m: m["cases"][0]["arrays"]["input/x"].update(shape=[-1, 4]),
            "has a malformed 'arrays'",
        ),
    ],
)
def test_golden_manifest_field_of_the_wrong_type_is_refused(
    copy: Path, capsys, change, phrase: str
) -> None:
    # Fields verify reads were trusted: a missing refimpl_version was a KeyError traceback in
    # the CLI, a list for 'forward' or a negative shape surfaced mid-replay (or not at all),
    # and a duplicate case name replaced its twin silently. Tests only broke JSON or names.
    manifest = manifest_of(copy)
    change(manifest)
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    code, out, err = run_cli(capsys, "verify", str(copy))
    assert_refused(code, out, err, phrase, "re-export the directory")
    assert err.count("\n") == 1
