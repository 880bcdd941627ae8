"""The rehearsal's parts below the flow (components/tuning.py): its folds hold every public row out once and
no private row anywhere; it trains at the private stage's noise per example; its ranking and the spec's
then/among rules; validate's sigma by the law of K."""
import copy
import math
import re

import pytest

import specs
from components import builders
from components.tuning import law_lines, ranked, rehearsal_rows, rehearsal_spec, sigma_by_law

SPACE = {"optimizer.lr": [0.005, 0.02, 0.08], "mechanism.clip": [1.0, 2.0]}


def _spec(tiny, **tune):
    d = copy.deepcopy(tiny)
    d["tune"] = {"space": SPACE, "candidates": {"distribution": "geometric", "mean": 3}, **tune}
    return d


@pytest.mark.parametrize("folds", [2, 4, 5])
def test_the_folds_hold_every_public_row_out_once_and_read_no_private_row(tiny_spec_dict, folds):
    spec = specs.spec_from_dict(_spec(tiny_spec_dict, rows="public", folds=folds))
    data = builders.load_data(spec)
    public, private = set(data.public.fingerprints), set(data.private.fingerprints)
    held = []
    for fold in range(folds):
        rows = rehearsal_rows(data, spec.seed, fold, folds)
        trained, scored = set(rows.private.fingerprints), set(rows.public.fingerprints)
        assert trained | scored == public and not trained & scored and not (trained | scored) & private
        held.extend(rows.public.fingerprints)
    assert sorted(held) == sorted(data.public.fingerprints)


def test_too_few_public_rows_for_the_folds_is_refused_in_one_line(tiny_spec_dict):
    spec = specs.spec_from_dict(_spec(tiny_spec_dict, rows="public", folds=40))
    data = builders.load_data(spec)
    with pytest.raises(ValueError, match=r"^tune.rows: public needs .*40 folds.*the split has \d+; give") as err:
        rehearsal_rows(data, spec.seed, 0, 40)
    assert "\n" not in str(err.value)


def test_the_rehearsal_trains_at_the_private_stages_noise_per_example(tiny_spec_dict):
    """sigma * clip / batch, the noise on a step's mean gradient, is the private stage's: the batch capped at
    the public rows there are, sigma scaled with it; the steps are the private stage's."""
    spec = specs.spec_from_dict(_spec(tiny_spec_dict, rows="public"))
    resolved, _, _ = builders.resolve_privacy(spec, 1385)
    rehearsed = rehearsal_spec(resolved, 40, 1385)
    assert rehearsed.batch_size(40) == 40 and rehearsed.optimizer.steps == resolved.optimizer.steps
    assert rehearsed.budget is None
    private = float(resolved.mechanism.noise_multiplier) / resolved.batch_size(1385)
    assert float(rehearsed.mechanism.noise_multiplier) / 40 == pytest.approx(private, rel=1e-12)


def test_then_train_plans_one_run_at_the_one_run_sigma(tiny_spec_dict):
    """A rehearsal whose pick is trained once plans that run: its sigma is the spec's without a tune section,
    below the search's."""
    plain = dict(tiny_spec_dict)
    one, _, _ = builders.resolve_privacy(specs.spec_from_dict(plain), 1385)
    trained = _spec(tiny_spec_dict, rows="public", then="train")
    del trained["tune"]["candidates"]  # one pick: no K to draw
    picked, _, _ = builders.resolve_privacy(specs.spec_from_dict(trained), 1385)
    searched, _, _ = builders.resolve_privacy(specs.spec_from_dict(_spec(tiny_spec_dict, rows="public")), 1385)
    assert float(picked.mechanism.noise_multiplier) == pytest.approx(float(one.mechanism.noise_multiplier), rel=1e-9)
    assert float(searched.mechanism.noise_multiplier) > float(picked.mechanism.noise_multiplier)


def test_ranked_breaks_ties_by_the_other_metric_then_the_space_order_and_puts_failures_last():
    rows = [{"setting": {"x": i}, "scores": s} for i, s in enumerate([
        {"accuracy": 0.5, "loss": 1.0}, None, {"accuracy": 0.7, "loss": 0.9}, {"accuracy": 0.7, "loss": 0.8},
        {"accuracy": 0.7, "loss": 0.8}, {"accuracy": math.nan, "loss": 0.1}])]
    by_accuracy = [row["setting"]["x"] for row in ranked(rows, "accuracy")]
    assert by_accuracy[:4] == [3, 4, 2, 0] and set(by_accuracy[4:]) == {1, 5}
    assert [row["setting"]["x"] for row in ranked(rows, "loss")][:4] == [5, 3, 4, 2]


@pytest.mark.parametrize("tune, said", [
    ({"rows": "private", "then": "train"}, r"^then: train follows a rehearsal on the public rows"),
    ({"then": "search"}, r"^then: search follows a rehearsal"),
    ({"rows": "private", "candidates": None}, r"^candidates: give K's distribution"),
    ({"among": [{"optimizer.lr": 0.02}]}, r"^among: the setting .* names other fields than the space"),
    ({"among": [{"optimizer.lr": 0.03, "mechanism.clip": 1.0}]}, r"^among: optimizer.lr 0.03 is not one of"),
])
def test_the_tune_sections_stages_are_refused_in_one_line_where_they_do_not_combine(tiny_spec_dict, tune, said):
    d = _spec(tiny_spec_dict, **tune)
    if d["tune"].get("candidates", 1) is None:
        del d["tune"]["candidates"]
    with pytest.raises(specs.SpecError) as err:
        specs.spec_from_dict(d)
    line = str(err.value)
    assert "\n" not in line and line.startswith("tune: ") and re.search(said, line[len("tune: "):]), line


def test_among_is_what_a_search_draws_from(tiny_spec_dict):
    among = [{"optimizer.lr": 0.02, "mechanism.clip": 2.0}, {"optimizer.lr": 0.08, "mechanism.clip": 1.0}]
    spec = specs.spec_from_dict(_spec(tiny_spec_dict, among=among))
    assert spec.tune.settings() == among and len(_spec(tiny_spec_dict)["tune"]["space"]) == 2


def test_validate_names_the_cheapest_law_of_k_at_the_specs_mean(tiny_spec_dict):
    """Each law's sigma is its own calibration at the spec's E[K] (the spec's law gives the spec's sigma); the
    line names the least of them."""
    d = _spec(tiny_spec_dict)
    d["tune"]["candidates"] = {"distribution": "truncated_negative_binomial", "mean": 6, "shape": 0.5}
    spec = specs.spec_from_dict(d)

    def calibrate(varied):
        return builders.resolve_privacy(varied, 1385)[0].mechanism.noise_multiplier

    compared = sigma_by_law(spec, calibrate)
    described = {law.describe(): sigma for law, sigma in compared}
    assert set(described) == {"poisson (mean 6)", "geometric (mean 6)", "logarithmic (mean 6)",
                              "truncated negative binomial (mean 6, shape 0.5)"}
    assert described["truncated negative binomial (mean 6, shape 0.5)"] == pytest.approx(calibrate(spec), rel=1e-9)
    cheapest = min(described, key=described.get)
    lines = law_lines(spec, calibrate)
    assert lines[-1].startswith(f"tune: the cheapest at this mean is {cheapest}")
    assert sum("<- the spec's" in line for line in lines) == 1
