"""``refimpl plot`` against bad logs (issue 33): one line naming the file, line and field, no
figure written or half written; and the logs it must draw: extremes it accepts, graph-level
runs (issue 36), run folders whose names matplotlib would read as mathematics."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from refimpl.cli import main

pytest.importorskip("matplotlib")
import matplotlib

matplotlib.use("Agg")
import matplotlib.figure
import matplotlib.pyplot as plt

from refimpl.cli import plot, run_log

OLD = b"an earlier plot's figure"


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-epoch --diagnostics run: its log has every field a node-level log can have."""
    folder = tmp_path_factory.mktemp("good") / "run"
    args = ["train", "--epochs", "3", "--no-progress", "--diagnostics", "--out", str(folder)]
    assert main(args) == 0
    return folder


def with_line_2(good_run: Path, tmp_path: Path, change: Callable[[str], str]) -> Path:
    """A copy of ``good_run`` whose log's line 2 is ``change(line)``, and an earlier plot's
    ``curves.png`` beside it."""
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    lines = (run / "log.jsonl").read_text().splitlines()
    lines[1] = change(lines[1])
    (run / "log.jsonl").write_text("\n".join(lines) + "\n")
    (run / "curves.png").write_bytes(OLD)
    return run


def edit(change: Callable[[dict], object]) -> Callable[[str], str]:
    """A change of a line made on its record."""

    def apply(line: str) -> str:
        record = json.loads(line)
        change(record)
        return json.dumps(record)

    return apply


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def set_in(*keys: str, **values: object) -> Callable[[str], str]:
    """Set ``values`` in the record's entry at ``keys`` (none: the record itself)."""

    def change(record: dict) -> None:
        for key in keys:
            record = record[key]
        record.update(values)

    return edit(change)


def text(pattern: str, replacement: str) -> Callable[[str], str]:
    """Replace ``pattern`` in the line's text: JSON words ``json.dumps`` never writes."""
    return lambda line: re.sub(pattern, replacement, line, count=1)


BAD_LINES = {
    "grad-norms-null": (set_in(grad_norms=None), "grad_norms is null, expected an object"),
    "nested-lists": (
        set_in(train_acc=[[[0.5]]]),
        r"train_acc is a list, expected a number in 0\.\.1 or null",
    ),
    "deep-nesting": (
        set_in("grad_norms", "layer0", feature=nested(300)),
        r"grad_norms\.layer0\.feature is a list",
    ),
    "object-for-number": (set_in(val_acc={"a": 1}), "val_acc is an object"),
    "1e308": (
        set_in(train_loss=1e308),
        r"train_loss is 1e\+308, expected a number in -1e\+100\.\.1e\+100 or null",
    ),
    "1e400-reads-as-inf": (text(r'"train_loss": [^,]+', '"train_loss": 1e400'), "loss is inf"),
    "bare-NaN": (text(r'"val_acc": [^,]+', '"val_acc": NaN'), "val_acc is nan"),
    "bare-Infinity": (
        text(r'"conservation": \{"layer0": [^,}]+', '"conservation": {"layer0": -Infinity'),
        r"conservation\.layer0 is -inf",
    ),
    "accuracy-above-1": (set_in(test_acc=1.5), r"test_acc is 1\.5, expected a number in 0\.\.1"),
    "negative-norm": (
        set_in("grad_abs", "layer1", attention=-1.0),
        r"grad_abs\.layer1\.attention is -1\.0",
    ),
    "norm-1e308": (
        set_in("grad_norms", "layer0", feature=1e308),
        r"grad_norms\.layer0\.feature is 1e\+308",
    ),
    "string-number": (set_in(test_acc="0.5"), "test_acc is '0.5', expected a number"),
    "bool-number": (set_in(val_acc=True), "val_acc is true, expected a number"),
    "balance-sum-list": (
        set_in("balancedness", "layer0", sum=[1]),
        r"balancedness\.layer0\.sum is \[1\]",
    ),
    "balance-missing": (
        edit(lambda record: record.pop("balancedness")),
        "balancedness is null, expected an object",
    ),
    "epoch-repeated": (set_in(epoch=0), "epoch is 0, expected a whole number above 0"),
    "epoch-float": (set_in(epoch=1.0), r"epoch is 1\.0, expected a whole number"),
    "escaped-layer": (
        set_in("grad_norms", **{"\x1b[2J": {}}),
        r"grad_norms holds the layers \['layer0', 'layer1', '\\x1b\[2J'\], line 1 \['layer0',",
    ),
    "conservation-layers": (
        set_in(conservation={}),
        r"conservation holds the layers \[\], line 1 \['layer0'\]",
    ),
    "not-an-object": (lambda line: '"epoch train_loss"', "not a JSON object"),
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_plot_of_a_bad_log_value_names_file_line_and_field(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, name: str
) -> None:
    # A log with "grad_norms": null, nested lists where numbers belong or 1e308 ended in
    # "internal error" (AttributeError, OverflowError) or drew nonsense, often after writing
    # some figures; a string holding the required keys passed read_log. The plot tests only
    # drew logs that training had written.
    change, message = BAD_LINES[name]
    run = with_line_2(good_run, tmp_path, change)
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refimpl plot: error: {run / 'log.jsonl'}, line 2: ")
    assert re.search(message, err) and err.count("\n") == 1
    assert err.rstrip("\n").isprintable()  # a layer's escape sequence is shown escaped
    assert (run / "curves.png").read_bytes() == OLD  # checked before any figure is drawn
    assert sorted(path.name for path in run.glob("*.png")) == ["curves.png"]


def test_plot_of_a_multi_seed_run_with_one_bad_log_writes_nothing(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Each seed was drawn as it was read: seed0's figures were replaced before seed1's log
    # failed, leaving a run folder half re-plotted.
    for seed in (0, 1):
        shutil.copytree(good_run, tmp_path / f"seed{seed}")
    bad = tmp_path / "seed1" / "log.jsonl"
    bad.write_text(bad.read_text().replace('"val_acc": ', '"val_acc": 2.0, "was": ', 1))
    assert main(["plot", str(tmp_path)]) == 2
    assert f"{bad}, line 1: val_acc is 2.0, expected" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.png"))


def test_a_failed_figure_write_leaves_the_earlier_figure(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # savefig wrote straight into curves.png: a failure mid-write (a full disk, a bug)
    # left a truncated PNG where the earlier good figure had been.
    run = with_line_2(good_run, tmp_path, lambda line: line)

    def half_then_fail(self: matplotlib.figure.Figure, stream: object, **kwargs: object) -> None:
        stream.write(b"\x89PNG\r\n\x1a\n half")  # type: ignore[attr-defined]
        raise OSError("No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_then_fail)
    assert main(["plot", str(run)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert (run / "curves.png").read_bytes() == OLD
    assert not [path.name for path in run.iterdir() if path.name.endswith(".tmp")]


@pytest.mark.filterwarnings("error")  # matplotlib's overflow warnings fail the test
def test_plot_draws_the_extremes_it_accepts(good_run: Path, tmp_path: Path) -> None:
    # The bound on sizes (1e100) must leave every figure drawable: a log axis from the
    # smallest double to the largest accepted value, both signs where signs are allowed.
    def extremes(record: dict) -> None:
        record.update(train_loss=1e100, val_acc=None)
        record["grad_norms"]["layer0"]["feature"] = 1e100
        record["grad_norms"]["layer1"]["feature"] = 5e-324
        record["grad_abs"]["layer0"]["attention"] = 1e100
        record["balancedness"]["layer0"].update(sum=1e100, min=-1e100, max=1e100)
        record["conservation"]["layer0"] = 1e100

    run = with_line_2(good_run, tmp_path, edit(extremes))
    lines = (run / "log.jsonl").read_text().splitlines()
    lines[2] = edit(lambda r: r.update(train_loss=5e-324))(lines[2])
    (run / "log.jsonl").write_text("\n".join(lines) + "\n")
    names = ["curves.png", "grad_norms.png", "grad_abs.png", "balance.png"]
    assert plot.plot_run(run) == [run / name for name in names]
    assert all((run / name).read_bytes().startswith(b"\x89PNG") for name in names)


def test_plot_of_a_folder_named_like_mathematics(
    good_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A folder or layer name with two "$" was drawn as mathtext: "$\x$" failed to draw (a
    # ValueError naming no file) and "a$b$" lost its dollars.
    run = tmp_path / r"lr$\x$"
    shutil.copytree(good_run, run)
    assert main(["plot", str(run)]) == 0
    figures: list = []
    monkeypatch.setattr(plot, "_save", lambda plt_, figure, path: figures.append(figure) or path)
    plot.plot_run(run)
    assert figures[0]._suptitle.get_text() == r"lr\$\x\$"  # escaped: drawn as typed
    for figure in figures:
        plt.close(figure)


# -- graph-level runs (issue 36) -----------------------------------------------------------------
def graph_log(path: Path, metric: str, values: list[float | None]) -> Path:
    path.mkdir()
    lines = [
        {"epoch": epoch, "train_loss": 1.0 / (epoch + 1), f"val_{metric}": value,
         f"test_{metric}": 0.5}
        for epoch, value in enumerate(values)
    ]  # fmt: skip
    (path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_plot_draws_a_graph_transformer_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # refimpl plot refused the folder `refimpl train --model graph_transformer` writes ("no
    # train_acc, val_acc, ...: not a refimpl training log"): it knew node-level logs only.
    args = ["train", "--model", "graph_transformer", "--graphs", "20", "--epochs", "2",
            "--layers", "1", "--hidden", "8", "--heads", "2", "--pe-dim", "0", "--no-progress",
            "--seeds", "0", "1", "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    assert main(["plot", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    written = [line.removeprefix("wrote ") for line in lines if line.startswith("wrote ")]
    assert written == [
        str(tmp_path / "seed0" / "curves.png"),
        str(tmp_path / "seed1" / "curves.png"),
        str(tmp_path / "seeds.png"),
    ]
    assert all(Path(path).read_bytes().startswith(b"\x89PNG") for path in written)
    # the heat maps it has no data for are named, not drawn empty
    assert [line for line in lines if not line.startswith("wrote ")] == [
        f"note: {tmp_path / seed}: no grad_norms.png or grad_abs.png: a graph-level run logs "
        "no per-layer gradient norms"
        for seed in ("seed0", "seed1")
    ]


@pytest.mark.parametrize(
    ("metric", "values", "best", "name"),
    [
        ("mae", [0.9, 0.4, 0.4, 0.6], 1, "MAE"),  # lower is better; the first of a tie
        ("roc_auc", [0.6, 0.8, 0.8, 0.7], 1, "ROC-AUC"),  # higher is better
        ("roc_auc", [None, 0.8, 0.9, 0.7], 0, "ROC-AUC"),  # an empty split: epoch 0 stays
    ],
)
def test_graph_level_curves_mark_the_epoch_its_loop_selects(
    tmp_path: Path, metric: str, values: list, best: int, name: str
) -> None:
    # refimpl.train.graph_level keeps epoch 0, then each strictly better validation score
    # (NaN never is); the node-level rule (the highest, else the last) would mark others.
    log = run_log.read_run_log(graph_log(tmp_path / "run", metric, values) / "log.jsonl")
    assert log.kind.name == name and run_log.best_epoch(log.records, log.kind) == best
    figure = plot.curves_figure(plt, log.records, "run", log.kind)
    _, right = figure.axes
    assert (right.get_title(), right.get_ylabel()) == (f"{name} (eval mode)", name)
    val, test, marker = right.get_lines()
    expected = [math.nan if value is None else value for value in values]
    assert list(val.get_ydata()) == pytest.approx(expected, nan_ok=True)
    assert list(test.get_ydata()) == [0.5] * len(values)
    assert list(marker.get_xdata()) == [best, best]
    plt.close(figure)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([0.5, 1.5], r"line 2: val_roc_auc is 1\.5, expected a number in 0\.\.1 or null"),
        ([0.5, -0.1], r"line 2: val_roc_auc is -0\.1, expected a number in 0\.\.1"),
    ],
)
def test_graph_level_log_values_are_checked(tmp_path: Path, values: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_log.read_run_log(graph_log(tmp_path / "run", "roc_auc", values) / "log.jsonl")


def test_a_log_of_neither_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"epoch": 0, "train_loss": 1.0, "val_f1": 0.5}\n')  # a metric of neither
    message = r"log\.jsonl, line 1: no train_acc, val_acc, test_acc, grad_norms in the record"
    with pytest.raises(ValueError, match=message):
        run_log.read_run_log(path)
    path.write_text("")
    with pytest.raises(ValueError, match=r"log\.jsonl is empty: the run logged no epoch yet"):
        run_log.read_run_log(path)


def test_heat_map_of_a_thousand_layers_fits_what_agg_can_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The heat map grew 0.4 inch a layer: from about 1360 layers it passed Agg's 2**16 pixels
    # a side and savefig raised "Image size ... is too large", naming no file.
    layers = {f"layer{i}": {"feature": 0.1} for i in range(1500)}
    record = {"epoch": 0, "train_loss": 1.0, "train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5}
    (tmp_path / "log.jsonl").write_text(json.dumps({**record, "grad_norms": layers}) + "\n")
    figures: list = []
    monkeypatch.setattr(plot, "_save", lambda plt_, figure, path: figures.append(figure) or path)
    plot.plot_run(tmp_path)
    heat = figures[1]
    assert heat.get_size_inches()[1] * 120 < 2**16  # at the dpi _save writes
    assert len(heat.axes[0].get_yticklabels()) == 1500
    for figure in figures:
        plt.close(figure)


def test_seeds_of_different_kinds_are_not_averaged(
    good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # seeds.png averages one key over the seeds: a node-level and a graph-level seed in one
    # folder have no key in common, so the figure would have raised a KeyError mid-way.
    shutil.copytree(good_run, tmp_path / "seed0")
    graph_log(tmp_path / "seed1", "mae", [0.5, 0.4])
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"refimpl plot: error: the seeds of {tmp_path} log different metrics (MAE, accuracy): "
        "they are not one run; plot each seed's folder alone\n"
    )
    assert not list(tmp_path.rglob("*.png"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # nested past the JSON reader's recursion limit: "internal error: RecursionError"
        (
            '{"epoch": 0, "train_loss": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "log.jsonl, line 1: a record nested too deep to read",
        ),
        (b'{"epoch": 0}\n\xff\xfe\n', "log.jsonl: not a UTF-8 text file (invalid start byte"),
        ('{"epoch": ' + "9" * 5000 + "}\n{}\n", "log.jsonl, line 1: not a JSON record"),
    ],
    ids=["nested too deep", "not UTF-8", "an int of 5000 digits"],
)
def test_a_log_the_json_reader_cannot_read_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | bytes, message: str
) -> None:
    # these escaped read_log as a RecursionError or a UnicodeDecodeError naming no file
    log = tmp_path / "log.jsonl"
    log.write_bytes(content.encode() if isinstance(content, str) else content)
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_plot_of_a_sweep_folder_names_one_of_its_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # A sweep's folder holds its cells' runs two levels down: plot said only "has no
    # log.jsonl; pass the directory of a refimpl train run", naming nowhere to look.
    sweep = ["sweep", "--no-progress", "--hidden", "4", "--epochs", "2", "--depths", "1", "2"]
    assert main([*sweep, "--seeds", "0", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["plot", str(tmp_path)]) == 2
    cell = tmp_path / "csbm" / "xavier" / "L1"
    assert capsys.readouterr().err == (
        f"refimpl plot: error: {tmp_path} is a refimpl sweep, not one run: plot one of its "
        f"cells, such as {cell} (2 in all)\n"
    )
    assert main(["plot", str(cell)]) == 0
    assert (cell / "curves.png").is_file()
