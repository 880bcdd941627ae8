"""Bad data: each case is refused in one line naming the field, or handled in a documented, accounted way.

Refusals name a column and never a row's values or a count of rows (both are functions of the private
rows). A non-finite per-example value is bounded like any other; a run whose releases or parameters
become non-finite stops in one line."""
import copy
import math

import numpy as np
import pytest
import torch

import specs
from components import builders
from components.data.sources import Table
from components.data.split import fraction_split
from components.queries.clipped_sums import NON_FINITE_HANDLING, clip_sum, vector_clip_coefficients
from components.randomness import private_generator
from components.runtime.loop import NonFiniteError
from tests.conftest import write_digits_file

DIGITS = dict(label="digit", classes=list(range(10)))


def _spec(tiny, **over):
    tiny = copy.deepcopy(tiny)
    tiny["data"].setdefault("declared_private_rows", 1384)  # add/remove: the rate's public row count
    tiny["mechanism"]["noise_multiplier"] = 4.0  # checked against the target, not calibrated: faster
    for section, values in over.items():
        tiny[section] = values if not isinstance(tiny.get(section), dict) else {**tiny[section], **values}
    return specs.spec_from_dict(tiny)


def _file(tiny, path, split=None, **data):
    tiny = copy.deepcopy(tiny)
    tiny["data"] = {"source": {"kind": "file", "path": str(path), **DIGITS},
                    "split": split or {"kind": "fraction", "public": 0.2, "test": 0.2}, **data}
    return tiny


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def _table(features, labels, n_classes=2, columns=None):
    features = np.asarray(features, dtype=np.float32)
    return Table("t", features, np.asarray(labels, dtype=np.int64), n_classes, None, columns=columns)


# ---------------------------------------------------------------- features
def test_nan_or_inf_features_are_refused_naming_the_column_before_anything_runs(tmp_path, tiny_spec_dict, capsys):
    import pandas as pd

    from flows.cli import main

    path = write_digits_file(tmp_path / "d.csv", rows=range(60))
    frame = pd.read_csv(path)
    frame.loc[7, "px9"] = 4321.5
    frame.loc[7, "px12"] = float("inf")
    frame.to_csv(path, index=False)
    spec = _spec(_file(tiny_spec_dict, path))
    with pytest.raises(ValueError) as err:
        builders.load_data(spec)
    assert _one_line(err).startswith("data.source.features: column 'px12' ")
    assert "4321" not in str(err.value) and "row" not in str(err.value)
    (tmp_path / "spec.yaml").write_text(specs.dump_yaml(spec))
    assert main(["calibrate", str(tmp_path / "spec.yaml")]) == 2  # the command line: one line, nothing made
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and "'px12'" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "spec.yaml"]


def test_any_source_is_checked_for_non_finite_features_and_for_scaling_that_overflows():
    rows = [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0], [3.0, 4.0], [4.0, 5.0], [5.0, 6.0]]
    bad = [list(r) for r in rows]
    bad[4][1] = float("nan")
    with pytest.raises(ValueError) as err:
        fraction_split(_table(bad, [0, 1, 0, 1, 0, 1], columns=("a", "b")), public=0.0, test=0.0, imbalance=None,
                       seed=0, scale="none")
    assert _one_line(err) == ("data.source.features: column 'b' of t has missing or non-finite values (NaN or inf); "
                              "fill or drop them first")
    # public standardisation by a nearly constant public column: the others' values overflow float32
    spread = [[1.0, 0.0], [1.0, 1e-30], [1.0, 3e38], [1.0, 2.0]] * 3
    with pytest.raises(ValueError) as err:
        fraction_split(_table(spread, [0, 1] * 6), public=0.5, test=0.0, imbalance=None, seed=1, scale="public")
    assert _one_line(err).startswith("data.source.scale: column 1 (0-based, in the model's input order) of t is not "
                                     "finite after scaling (public)")
    # token ids are integers: nothing to check
    ids = Table("ids", np.arange(12, dtype=np.int64).reshape(6, 2), np.array([0, 1] * 3), 2, None)
    assert len(fraction_split(ids, public=0.0, test=0.0, imbalance=None, seed=0, scale="none").private) == 6


# ---------------------------------------------------------------- labels
def test_labels_outside_classes_are_refused_naming_the_column_not_the_values(tmp_path, tiny_spec_dict):
    import pandas as pd

    path = write_digits_file(tmp_path / "d.csv", rows=range(60))
    frame = pd.read_csv(path)
    frame.loc[3, "digit"] = 37
    frame.to_csv(path, index=False)
    with pytest.raises(ValueError) as err:
        builders.load_data(_spec(_file(tiny_spec_dict, path)))
    assert _one_line(err).startswith("data.source.classes: column 'digit' has labels not among classes")
    assert "37" not in str(err.value)
    # any source: a label past the declared classes never reaches the model
    with pytest.raises(ValueError) as err:
        fraction_split(_table([[0.0], [1.0], [2.0]], [0, 1, 2], n_classes=2), public=0.0, test=0.0, imbalance=None,
                       seed=0, scale="none")
    assert _one_line(err) == "data.source.label: t has labels outside its 2 classes (0..1); list every class"


# ---------------------------------------------------------------- the private split
def test_an_empty_private_split_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        fraction_split(_table([[0.0], [1.0], [2.0]], [0, 1, 0]), public=0.0, test=1.0, imbalance=None, seed=0,
                       scale="none")
    assert _one_line(err) == "data.split: no private rows left: every row went to the public or test split"


def test_a_private_split_smaller_than_the_expected_batch_runs_with_small_batches(tmp_path, tiny_spec_dict):
    """Poisson's rate is expected_batch_size / data.declared_private_rows, a public constant: a private split
    smaller than the expected batch just gives small batches, and is never checked against the private count."""
    path = write_digits_file(tmp_path / "d.csv", rows=range(40))
    spec = _spec(_file(tiny_spec_dict, path), optimizer={"steps": 3})
    data = builders.load_data(spec)
    assert len(data.private) < spec.sampling.expected_batch_size
    resolved, rate, _ = builders.resolve_privacy(spec, len(data.private))
    assert rate == pytest.approx(64 / spec.data.declared_private_rows)  # not / len(data.private)
    built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                sampling_generator=private_generator(2))
    built.loop.run(3)
    assert built.loop.tracker.steps == 3
    assert all(math.isfinite(v) for _, values in built.loop.released for v in values)


def test_fixed_size_refuses_a_batch_larger_than_its_public_row_count(tmp_path, tiny_spec_dict):
    path = write_digits_file(tmp_path / "d.csv", rows=range(40))
    tiny = _file(tiny_spec_dict, path)  # replace-one: the private count is public, and a batch must fit in it
    tiny["privacy"]["neighboring"] = "replace_one"
    tiny["sampling"] = {"kind": "fixed_size", "batch_size": 64}
    spec = specs.spec_from_dict(tiny)
    data = builders.load_data(spec)
    with pytest.raises(ValueError) as err:
        builders.resolve_privacy(spec, len(data.private))
    assert _one_line(err).startswith("sampling.batch_size: 64 must be between 1 and the ")


# ---------------------------------------------------------------- non-finite losses
def test_a_non_finite_per_example_value_moves_a_sum_by_at_most_the_clip():
    finite = torch.tensor([[0.5, -3.0, 0.25]], dtype=torch.float64)
    for odd, contribution in ((math.nan, 0.0), (math.inf, 1.0), (-math.inf, -1.0)):
        with_odd = torch.cat([finite, torch.tensor([[odd]], dtype=torch.float64)], dim=1)
        assert clip_sum(with_odd, 1.0).item() - clip_sum(finite, 1.0).item() == pytest.approx(contribution)
    # DPGD-0th: an example with any non-finite coordinate contributes nothing
    values = torch.tensor([[0.3, math.nan], [0.1, 2.0]], dtype=torch.float64)
    gram = torch.eye(2, dtype=torch.float64)
    assert torch.allclose(vector_clip_coefficients(values, gram, 1.0),
                          vector_clip_coefficients(values[:, :1], gram, 1.0))
    assert "never counted or released" in NON_FINITE_HANDLING


def _nan_loss_for(monkeypatch, rows):
    """The private model's per-example loss is NaN on the first ``rows`` rows of every batch (a model that
    diverges at the perturbed point on some examples)."""
    import components.runtime.local as local

    original = local.per_example_loss

    def loss(model, x, y):
        out = original(model, x, y).clone()
        out[:rows] = math.nan
        return out

    monkeypatch.setattr(local, "per_example_loss", loss)


def test_a_nan_loss_at_the_perturbed_point_is_bounded_and_the_run_goes_on(tiny_spec_dict, monkeypatch):
    spec = _spec(tiny_spec_dict, optimizer={"steps": 3})
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                sampling_generator=private_generator(2))
    _nan_loss_for(monkeypatch, 5)
    built.loop.run(3)
    assert all(math.isfinite(v) for _, values in built.loop.released for v in values)
    assert all(bool(torch.isfinite(p).all()) for p in built.loop.backend.directions.params)


def test_a_run_whose_release_is_not_finite_stops_in_one_line(tiny_spec_dict, monkeypatch):
    """mechanism none clips nothing: the NaN reaches the release, and the run stops instead of training on it."""
    tiny = copy.deepcopy(tiny_spec_dict)
    del tiny["privacy"]
    tiny["mechanism"] = {"kind": "none"}
    spec = specs.spec_from_dict(tiny)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, sampling_generator=private_generator(2))
    _nan_loss_for(monkeypatch, 1)
    with pytest.raises(NonFiniteError) as err:
        built.loop.run(3)
    assert _one_line(err).startswith("training diverged: a value released at step 0 is not finite (mechanism none")
    assert built.loop.journal == []  # nothing was applied


def test_a_run_whose_parameters_become_non_finite_stops_in_one_line(tiny_spec_dict):
    spec = _spec(tiny_spec_dict, optimizer={"steps": 5})
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                sampling_generator=private_generator(2))
    backend, apply = built.loop.backend, built.loop.backend.apply

    def overflowing_apply(update):  # the second update overflows, as a too-large step would
        apply(update)
        if built.loop.step == 1:
            with torch.no_grad():
                backend.directions.params[0].view(-1)[0] = math.inf

    backend.apply = overflowing_apply
    with pytest.raises(NonFiniteError) as err:
        built.loop.run(5)
    assert _one_line(err).startswith("training diverged: the model's parameters are not finite after step 1's update")
    # the diverged step was accounted, and never completed: it is in no journal
    assert built.loop.tracker.steps == 2 and built.loop.step == 1
    assert {e.step for e in built.loop.journal} == {0}


def test_a_step_size_the_parameters_cannot_hold_stops_in_one_line(tiny_spec_dict):
    import specs
    from components import builders
    from components.runtime.loop import NonFiniteError

    tiny_spec_dict["optimizer"].update(lr=1e300, steps=3)
    spec = specs.spec_from_dict(tiny_spec_dict)
    data = builders.load_data(spec)
    built = builders.build_loop(builders.resolve_privacy(spec)[0], data)
    with pytest.raises(NonFiniteError, match="overflows the parameters' type; lower optimizer.lr"):
        built.loop.run(3)
