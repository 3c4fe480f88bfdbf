"""The theorem-check runner (proofs_check): records, verdicts that can fail, CLI, errata.

Besides running each check, every test here that breaks something asserts the
check notices: a check that cannot fail proves nothing.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, target
from hypothesis import strategies as st

import proofs_check
from proofs_check import errata, erratum, runner, softmax
from proofs_check.errata import ERRATA
from proofs_check.registry import Record, WorstCase, check, margin_of
from refimpl.backend import to_numpy
from refimpl.kernels.segment import segment_softmax
from refimpl.testing.strategies import graphs, seeds

RECORD_TYPES = {
    "id": str,
    "paper": str,
    "statement": str,
    "bound": float,
    "measured": float,
    "margin": float,
    "passed": bool,
    "n_cases": int,
    "relation": str,
    "tightness": float,
}
ERRATUM_TYPES = {
    "id": str,
    "paper": str,
    "where": str,
    "printed": str,
    "correct": str,
    "counterexample": str,
    "detail": str,
    "demonstrated": bool,
}
FAST = 8  # random cases per check in these tests: the fixed adversarial cases always run
REPO = Path(__file__).resolve().parents[1]
CHECK_IDS = list(proofs_check.load_checks())
_ROW_SOFTMAX = softmax.row_softmax  # the real one, kept before any monkeypatch


def _not_normalised(scores):
    # exp without the division: rows sum to anything but one.
    return np.exp(scores - scores.max(axis=1, keepdims=True))


def _half(scores):
    # Normalised, then halved: every bound of Lemma 2 and Eq. 10 is off by a factor.
    return 0.5 * _ROW_SOFTMAX(scores)


# -- records and registry -------------------------------------------------------------------
def test_the_first_checks_are_registered_in_order():
    assert CHECK_IDS[:5] == [
        "softmax.rows_sum_to_one",
        "lipschitznorm.lemma2.lower",
        "lipschitznorm.lemma2.upper",
        "lipschitznorm.eq10",
        "softmax.dense_matches_segment",
    ]


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_each_check_passes_with_a_record_of_exact_keys_and_types(check_id):
    record = proofs_check.REGISTRY[check_id](seed=0, cases=FAST)
    as_dict = record.as_dict()
    assert set(as_dict) == set(RECORD_TYPES)
    for key, kind in RECORD_TYPES.items():
        assert type(as_dict[key]) is kind, key  # bool is not an int here, float not np.float64
    assert record.passed, record
    # The softmax checks add fixed adversarial cases to the random ones; the
    # conservation checks that run gradient descent use a fraction of the budget.
    minimum = FAST + 1 if check_id.startswith(("softmax", "lipschitznorm")) else 1
    assert record.margin >= 0 and record.n_cases >= minimum
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_same_seed_same_records_and_only_reproduces_the_full_run():
    full = runner.run(seed=7, cases=FAST)
    assert runner.run(seed=7, cases=FAST) == full
    assert runner.run(seed=7, cases=FAST, pattern="lemma2.upper") == [full[2]]
    assert runner.run(seed=8, cases=FAST) != full


def test_checks_run_on_the_strict_backend():
    # The strict stand-in raises on any stray numpy call on backend arrays (as CuPy would).
    for record in runner.run(seed=1, cases=FAST, backend="strict"):
        assert record.passed, record


def test_a_second_function_cannot_take_a_registered_id():
    with pytest.raises(ValueError, match="already registered"):
        check(id="softmax.rows_sum_to_one", paper="x", statement="x")(
            lambda ctx: WorstCase("upper")
        )


# -- the sign convention and the worst case -------------------------------------------------
def test_margin_sign_convention_for_upper_and_lower_bounds():
    assert margin_of(0.5, 1.0, "upper") == 0.5 and margin_of(1.5, 1.0, "upper") == -0.5
    assert margin_of(1.5, 1.0, "lower") == 0.5 and margin_of(0.5, 1.0, "lower") == -0.5
    with pytest.raises(ValueError):
        margin_of(0.0, 0.0, "equal")


@pytest.mark.parametrize(
    ("sense", "values", "bounds", "expected"),
    [
        # Relative ranking: 90 of 100 allowed outranks 0 of 2, though its absolute margin is larger.
        ("upper", [0.0, 90.0], [2.0, 100.0], (90.0, 100.0, 10.0, True)),
        ("upper", [0.5, 3.0], [1.0, 1.0], (3.0, 1.0, -2.0, False)),  # a wrong bound fails
        ("lower", [2.0, 0.9], [1.0, 1.0], (0.9, 1.0, -0.1, False)),
        ("upper", [0.5, np.nan, 9.0], [1.0, 1.0, 1.0], (np.nan, 1.0, np.nan, False)),
    ],
)
def test_worst_case_is_the_smallest_relative_margin_and_decides_the_verdict(
    sense, values, bounds, expected
):
    worst = WorstCase(sense)
    for value, bound in zip(values, bounds, strict=True):
        worst.add(value, bound)
    got = (worst.measured, worst.bound, worst.margin, bool(worst.margin >= 0))
    np.testing.assert_allclose(got[:3], expected[:3])
    assert got[3] is expected[3] and worst.n_cases == len(values)


def test_a_check_that_evaluates_no_case_fails(monkeypatch):
    monkeypatch.setattr(softmax, "score_matrices", lambda ctx: iter(()))
    record = proofs_check.REGISTRY["lipschitznorm.eq10"](cases=FAST)
    assert record.n_cases == 0 and not record.passed


# -- broken variants fail -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("broken", "failing"),
    [
        (
            _not_normalised,
            {
                "softmax.rows_sum_to_one",
                "lipschitznorm.lemma2.upper",
                "lipschitznorm.eq10",
                "softmax.dense_matches_segment",
            },
        ),
        (
            _half,
            {
                "softmax.rows_sum_to_one",
                "lipschitznorm.lemma2.lower",
                "lipschitznorm.eq10",
                "softmax.dense_matches_segment",
            },
        ),
    ],
)
def test_a_broken_row_softmax_fails_its_checks_and_the_cli(monkeypatch, broken, failing):
    monkeypatch.setattr(softmax, "row_softmax", broken)
    records = {r.id: r for r in runner.run(cases=FAST, pattern="*")}
    assert {i for i, r in records.items() if not r.passed} == failing
    assert all(records[i].margin < 0 for i in failing)
    out = io.StringIO()
    assert runner.main(["--cases", str(FAST)], out=out) == 1
    assert "FAIL" in out.getvalue() and f"{len(failing)} failed" in out.getvalue()


def test_a_segment_softmax_that_skips_normalising_fails(monkeypatch):
    def unnormalised(scores, segments):
        with np.errstate(over="ignore"):  # exp(1e3) = inf is part of the breakage
            return segments.xp.exp(scores)  # no max shift, no division

    monkeypatch.setattr(softmax, "segment_softmax", unnormalised)
    assert not proofs_check.REGISTRY["softmax.rows_sum_to_one"](cases=FAST).passed
    assert not proofs_check.REGISTRY["softmax.dense_matches_segment"](cases=FAST).passed


# -- the CLI --------------------------------------------------------------------------------
def test_cli_writes_checks_and_errata_as_json_and_exits_zero(tmp_path):
    path = tmp_path / "records.json"
    done = subprocess.run(
        [sys.executable, "-m", "proofs_check", "--cases", str(FAST), "--json", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(path.read_text())
    records, errata = report["checks"], report["errata"]
    assert set(report) == {"checks", "errata"} and [r["id"] for r in records] == CHECK_IDS
    assert all(set(r) == set(RECORD_TYPES) and r["passed"] is True for r in records)
    assert [e["id"] for e in errata] == [e.id for e in ERRATA]
    for entry in errata:
        assert {key: type(value) for key, value in entry.items()} == ERRATUM_TYPES
        assert entry["demonstrated"] is True
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == f"{len(CHECK_IDS)} checks, {len(CHECK_IDS)} passed, 0 failed"
    assert "Errata" in done.stdout and "lipschitznorm.lemma2.proof.row_sums" in done.stdout


def test_cli_pattern_that_selects_nothing_is_a_usage_error(capsys):
    assert runner.main(["--only", "no.such.check"]) == 2
    assert "no check or erratum" in capsys.readouterr().err


def test_table_is_aligned_and_fits_100_columns():
    records = runner.run(cases=0)
    table = runner.format_table(records).splitlines()
    verdict_column = table[0].index("verdict")
    rows = [line for line in table[2:] if not line.startswith("    ")]  # statements indented
    assert len(rows) == len(records)
    assert all(line[verdict_column:].strip() == "pass" for line in rows)
    assert max(map(len, table)) <= runner.WIDTH == 100
    # every statement in full (wrapped, never cut), under its row
    text = " ".join(line.strip() for line in table)
    assert all(" ".join(f"{r.paper}: {r.statement}".split()) in text for r in records)


def test_each_row_shows_the_relation_that_must_hold():
    # upper bounds measured <= bound, lower bounds (the negative controls, Lemma 2's lower)
    # measured >= bound; the margin is measured inside the bound either way
    records = runner.run(cases=0)
    by_id = {r.id: r for r in records}
    assert by_id["lipschitznorm.lemma2.lower"].relation == ">="
    assert by_id["gat_balance.negative_control.elu"].relation == ">="
    assert by_id["lipschitz.cor1"].relation == "<="
    for record in records:
        inside = record.bound - record.measured if record.relation == "<=" else (
            record.measured - record.bound)  # fmt: skip
        assert record.margin == pytest.approx(inside, rel=1e-12, abs=1e-300), record.id
        row = next(line for line in runner.format_table([record]).splitlines()[2:])
        assert f" {record.relation} " in row


def test_errata_lines_fit_100_columns_and_carry_every_field():
    errata = [(e, e.evaluate()) for e in ERRATA]
    text = runner.format_errata(errata)
    assert max(map(len, text.splitlines())) <= runner.WIDTH
    flat = " ".join(text.split())
    for entry, evidence in errata:
        for field in (entry.printed, entry.correct, evidence.detail):
            assert " ".join(field.split()) in flat, entry.id


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """``runner.main(argv)`` with argparse's exit caught: (status, stdout, stderr)."""
    try:
        code = runner.main(list(argv))
    except SystemExit as exited:
        code = exited.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    assert err.startswith("python -m proofs_check: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing/records.json", "no folder .*missing for the --json file"),
        (".", "--json file .* is a folder; give a file name"),
    ],
)
def test_proofs_check_json_bad_path_is_refused_before_any_check_runs(
    monkeypatch, tmp_path, capsys, name, message
):
    # --json BADPATH ran every check (minutes), then open() raised with a traceback, before
    # the table was printed: all that work lost. The one CLI test wrote to a good path.
    monkeypatch.setattr(runner, "run", lambda **kwargs: pytest.fail("checks ran"))
    code, out, err = run_main(capsys, "--json", str(tmp_path / name))
    assert code == 2 and out == ""
    assert re.search(message, one_error_line(err))


def test_proofs_check_json_is_written_atomically(monkeypatch, tmp_path, capsys):
    # The JSON was written with open(path, "w"): an error mid-write left half a file in place
    # of the previous records. It goes through atomic_write; an error there is one line.
    path = tmp_path / "records.json"
    assert run_main(capsys, "--only", "softmax.rows", "--cases", "0", "--json", str(path))[0] == 0
    written = path.read_text()
    assert [r["id"] for r in json.loads(written)["checks"]] == ["softmax.rows_sum_to_one"]

    def full_disk(target, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner, "atomic_write", full_disk)
    code, _, err = run_main(capsys, "--only", "softmax.rows", "--cases", "0", "--json", str(path))
    assert code == 2 and "No space left on device" in one_error_line(err)
    assert path.read_text() == written and list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    ("raised", "code", "message"),
    [
        (KeyboardInterrupt(), 130, "interrupted (Ctrl-C)"),
        (RuntimeError("boom"), 1, "a check raised RuntimeError: boom (a failed check"),
        (MemoryError(), 2, "error: MemoryError"),
    ],
)
def test_proofs_check_interrupt_and_crash_are_one_line(monkeypatch, capsys, raised, code, message):
    # Ctrl-C, a check that raised and running out of memory each ended in a traceback.
    def run(**kwargs):
        raise raised

    monkeypatch.setattr(runner, "run", run)
    status, _, err = run_main(capsys, "--cases", "0")
    assert status == code and message in one_error_line(err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cases", "-1"], "argument --cases: must be an integer >= 0, got -1"),
        (["--seed", "-3"], "argument --seed: must be an integer >= 0, got -3"),
        (["--seed", "1.5"], "argument --seed: must be an integer, got '1.5'"),
        (["--backend", "gpu"], "argument --backend: invalid choice: 'gpu'"),
    ],
)
def test_proofs_check_usage_errors_are_one_line(capsys, argv, message):
    # A negative --seed passed argparse and crashed in numpy's default_rng after the imports;
    # argparse's own errors printed the whole usage first.
    code, _, err = run_main(capsys, *argv)
    assert code == 2 and message in one_error_line(err)


# -- errata ---------------------------------------------------------------------------------
def test_errata_entries_are_complete_and_their_counterexamples_hold():
    assert errata.ERRATA, "the errata list must not be empty"
    for entry in errata.ERRATA:
        assert all([entry.id, entry.paper, entry.location, entry.printed, entry.correct])
        evidence = entry.evaluate()
        assert not evidence.printed_holds and evidence.correct_holds, entry.id


def test_lipschitznorm_proof_of_lemma2_sums_over_the_wrong_index():
    # App. Sec. 9.3 prints sum_i softmax(M)_ij = 1; a row softmax makes the rows sum to one.
    scores = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    probabilities = softmax.row_softmax(scores)
    np.testing.assert_allclose(probabilities.sum(axis=1), [1.0, 1.0], rtol=1e-15)
    assert np.all(np.abs(probabilities.sum(axis=0) - 1.0) > 0.2)  # 0.755, 0.489, 0.755


def test_a_broken_erratum_fails_the_run(monkeypatch):
    # A counterexample that stopped showing the error must not be listed as demonstrated.
    fake = erratum.Evidence(printed_holds=True, correct_holds=True, detail="")
    bad = erratum.Erratum("x.bad", "P", "here", "a", "b", "c", lambda: fake)
    monkeypatch.setattr(runner, "ERRATA", [bad])
    out = io.StringIO()
    assert runner.main(["--only", "x.bad"], out=out) == 1
    assert "NOT DEMONSTRATED" in out.getvalue()


# -- Hypothesis: Lemma 2 and Eq. 10 on drawn shapes -----------------------------------------
def _scores(m: int, n: int, seed: int, log_scale: float) -> np.ndarray:
    return 10.0**log_scale * np.random.default_rng(seed).standard_normal((m, n))


shapes = st.integers(1, 24)
log_scales = st.floats(-3.0, 3.0)  # 1e-3: near-uniform rows; 1e3: one-hot rows


@given(m=shapes, n=shapes, seed=seeds(), log_scale=log_scales)
@example(m=5, n=7, seed=0, log_scale=-300.0)  # uniform rows: the lower bound, attained
@example(m=4, n=9, seed=0, log_scale=3.0)  # one-hot rows: the upper bound, attained
@example(m=6, n=1, seed=0, log_scale=0.0)  # one column: both bounds are sqrt(m)
def test_lemma2_holds_on_drawn_shapes(m, n, seed, log_scale):
    lower, upper, allowance = softmax.lemma2_ratios(_scores(m, n, seed, log_scale))
    target(-(lower - 1.0), label="how far below sqrt(m/n)")
    target(upper - 1.0, label="how far above sqrt(m)")
    assert 1.0 - allowance <= lower and upper <= 1.0 + allowance


@given(m=shapes, n=shapes, seed=seeds(), log_scale=log_scales)
@example(m=5, n=7, seed=0, log_scale=-300.0)
@example(m=4, n=9, seed=0, log_scale=3.0)
def test_eq10_holds_on_drawn_shapes(m, n, seed, log_scale):
    deviation, allowance = softmax.eq10_relative_deviation(_scores(m, n, seed, log_scale))
    target(deviation / allowance, label="share of the rounding allowance used")
    assert deviation <= allowance


@given(graph=graphs(max_nodes=9, max_edges=24), seed=seeds(), heads=st.integers(1, 3))
def test_neighbourhood_softmax_sums_to_one_on_drawn_graphs(graph, seed, heads):
    scores = np.random.default_rng(seed).normal(scale=30.0, size=(graph.num_edges, heads))
    alpha = to_numpy(segment_softmax(scores, graph.dst_segments(np)))  # (E, H)
    sums = np.zeros((graph.num_nodes, heads))
    np.add.at(sums, to_numpy(graph.edge_index)[1], alpha)
    degree = to_numpy(graph.in_degree())
    eps = np.finfo(np.float64).eps
    assert np.all(np.abs(sums[degree > 0] - 1.0) <= 2 * degree[degree > 0, None] * eps)
    assert np.all(sums[degree == 0] == 0.0)  # zero in-degree: no output at all


def test_record_is_frozen():
    record = Record("a", "p", "s", 1.0, 0.5, 0.5, True, 1)
    with pytest.raises(AttributeError):
        record.passed = False  # type: ignore[misc]


def test_a_softmax_off_by_3e_12_does_not_demonstrate_the_row_sum_erratum(monkeypatch):
    # Guards the errata's _ATOL = 1e-12 (mutant: 1e-11 passed): rows summing to 1 + 3e-12
    # are not "exact to a few ulps", so the corrected identity must not be taken to hold.
    monkeypatch.setattr(softmax, "row_softmax", lambda scores: (1 + 3e-12) * _ROW_SOFTMAX(scores))
    evidence = errata.ERRATA[0].evaluate()
    assert errata.ERRATA[0].id == "lipschitznorm.lemma2.proof.row_sums"
    assert not evidence.correct_holds and not evidence.demonstrated


def test_tied_worst_cases_keep_the_first_whether_added_together_or_apart():
    # Guards WorstCase.add's strict < (mutant: <= passed): within one add, argmin keeps the
    # first of tied cases, so across adds the first must be kept too, or a check's record
    # would depend on how it batched its cases.
    together, apart = WorstCase("upper"), WorstCase("upper")
    together.add(np.array([1.0, 2.0]), np.array([2.0, 4.0]))  # relative margins 0.5, 0.5
    apart.add(1.0, 2.0)
    apart.add(2.0, 4.0)
    assert (together.measured, together.bound) == (apart.measured, apart.bound) == (1.0, 2.0)


def test_the_report_says_the_law_is_not_a_gradient_check(capsys):
    assert runner.main(["--only", "gat_balance.thm2", "--cases", "2"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert " ".join(runner.LAW_NOTE.split()) in printed
    assert runner.main(["--only", "softmax.rows", "--cases", "0"]) == 0
    assert "not a gradient check" not in capsys.readouterr().out
