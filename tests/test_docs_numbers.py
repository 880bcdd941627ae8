"""The numbers the README, the manual and docs/results.md state about the digits split come from the code."""
from __future__ import annotations

import pytest

import specs
from components import builders
from tests.conftest import EXAMPLES, ROOT


def _split(seed: int):
    spec = specs.load_spec(EXAMPLES / "digits_dpzero.yaml")
    data = builders.load_data(spec.model_copy(update={"seed": seed}))
    return spec, len(data.private), len(data.public), len(data.test)


def test_the_readme_states_the_main_jobs_split_and_constants():
    spec, n_private, n_public, n_test = _split(0)
    readme = (ROOT / "README.md").read_text()
    # the manual states them again: the main job on its getting-started page, the spec on its specs page
    guide = "".join((ROOT / "docs" / "guide" / page).read_text() for page in ("index.md", "specs-and-data.md"))
    declared = spec.data.declared_private_rows
    assert declared == n_private  # the example declares the count its public seed's split gives
    resolved, _rate, _eps = builders.resolve_privacy(spec)
    for said in (f"digits ({n_private:,} private rows, {n_test} test rows, {n_public} rows held out as public",
                 f"the spec declares N = {declared:,}", f"({resolved.optimizer.steps:,} steps)",
                 f"δ = 1/{declared})-DP", f"declared_private_rows: {declared}"):
        assert said in readme, said
        assert said in guide, said


def test_results_doc_states_the_split_of_its_seeds():
    splits = [_split(seed) for seed in (0, 1, 2)]  # the reporting seeds
    public = sorted({p for _s, _n, p, _t in splits})
    private = sorted({n for _s, n, _p, _t in splits})
    setup = (ROOT / "docs" / "results.md").read_text().split("## Setup", 1)[1].split("\n## ", 1)[0]
    said = " ".join(setup.split())
    assert (f"{public[0]}–{public[-1]} public rows and {private[0]:,}–{private[-1]:,} private rows by seed "
            f"(seed 0: {splits[0][2]} and {splits[0][1]:,})") in said, said[:400]


@pytest.mark.parametrize("doc, csv_name", [("results.md", "digits_dope_pda"), ("results_pazo.md", "mnist_pazo"),
                                           ("results_pazo.md", "chatterbot_id"), ("results_pazo.md", "chatterbot_ood")])
def test_results_doc_tables_are_their_csvs(doc, csv_name):
    """A results table in docs/ is what the sweep's own results_table makes of the CSV beside it."""
    import csv

    from flows.sweep import results_table

    text = (ROOT / "docs" / doc).read_text()
    with open(ROOT / "docs" / "results" / f"{csv_name}.csv") as f:
        cells = [dict(row, epsilon=float(row["epsilon"]), accuracy=float(row["accuracy"]),
                      seconds=float(row["seconds"]) if row.get("seconds") else None) for row in csv.DictReader(f)]
    table = results_table(cells, sorted({c["epsilon"] for c in cells}))
    for line in table.splitlines()[2:]:
        accuracies = line.rsplit(" | ", 1)[0] + " |"  # a doc may leave out the time column
        assert accuracies in text, line
