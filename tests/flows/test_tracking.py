"""MLflow tags: what a run releases about its data."""
import pytest

from flows.record.tracking_names import DP_LARGE_DELTA


def test_released_fingerprint_is_keyed_and_the_key_file_is_private(tmp_path, monkeypatch):
    """data.fingerprint is an HMAC under a secret key: stable for one key, different under another, and
    never the plain content hash; without the variable a per-user key file is created, owner-only."""
    import stat

    from flows.record.tracking import KEY_ENV, released_fingerprint

    plain = "ab" * 32
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    first = released_fingerprint(plain)
    key_file = tmp_path / ".privzo" / "fingerprint.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_text()) == 64
    assert released_fingerprint(plain) == first != plain
    monkeypatch.setenv(KEY_ENV, "another key")
    assert released_fingerprint(plain) not in (first, plain)
    assert [f.name for f in key_file.parent.iterdir()] == ["fingerprint.key"]  # no temporary file left


def test_a_damaged_key_file_is_refused_never_used(tmp_path, monkeypatch):
    """An empty or cut key (a write that never finished) would make every keyed fingerprint computable."""
    import pytest

    from flows.record.tracking import KEY_ENV, keyed_rows

    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".privzo").mkdir()
    (tmp_path / ".privzo" / "fingerprint.key").write_text("")
    with pytest.raises(ValueError, match=r"fingerprint key .* holds 0 characters, fewer than 32: it is damaged"):
        keyed_rows(["ab" * 32])


def test_a_shown_epsilon_never_understates_and_a_large_delta_leads_the_guarantee():
    """Shown values round up (a remainder down); a run allowed a delta above 1/N says first that its pair
    promises nothing of a row, in the guarantee, the report and a tag."""
    import yaml

    import specs
    from components import builders
    from flows.record.reporting import privacy_report, shown, shown_left, summarize
    from flows.record.tracking import dp_tags
    from tests.flows.test_cli import EXAMPLES

    assert (shown(1.9999999989515187), shown(1.23441), shown(0.000722543, 3)) == ("2", "1.235", "0.000723")
    assert shown_left(0.860201) == "0.8602" and shown_left(-0.1) == "0"
    data = yaml.safe_load((EXAMPLES / "digits_dpzero.yaml").read_text())
    data["privacy"].update(delta=0.01, allow_large_delta=True)
    resolved, _, _ = builders.resolve_privacy(specs.spec_from_dict(data), 1300)
    summary = summarize(resolved, 2.0, 10, builders.spec_sampler(resolved, 1300), 4)
    assert summary.guarantee().startswith("NOT a meaningful guarantee: delta 0.01 is above 1/N = 1/1384 "
                                          "(privacy.allow_large_delta)")
    assert "(above 1/N = 1/1384: not a meaningful guarantee)" in privacy_report(summary, {})
    assert dp_tags(summary, "ab" * 32)[DP_LARGE_DELTA] == "true"


class NoColumn(ValueError):
    """An input error of its own type, with an attribute (as privzo's data errors have)."""

    def __init__(self, column):
        super().__init__(f"data.source.label: no column {column!r}")
        self.column = column


def test_only_refusals_lose_their_tracebacks():
    """A refusal (the ledger's, or an input error before the first private step) is logged without its
    traceback; an error once training runs is a crash and keeps it."""
    import logging
    import sys

    from flows.ledger import BudgetExceeded
    from specs.refusal import _RefusalsWithoutTracebacks, checking_input, is_refusal

    def record_of(err):
        try:
            raise err
        except BaseException:
            return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())

    with pytest.raises(NoColumn) as raised:  # still its own type, with its message and attributes
        with checking_input():
            raise NoColumn("y")
    refused_input = raised.value
    assert str(refused_input) == "data.source.label: no column 'y'" and refused_input.column == "y"
    with pytest.raises(FileNotFoundError) as missing:
        with checking_input():
            open("/nonexistent/privzo/spec.csv")
    assert is_refusal(missing.value) and missing.value.filename == "/nonexistent/privzo/spec.csv"
    # a flow run's Failed state carries the refusal to other processes: it pickles as what it is
    import pickle

    for err in (refused_input, missing.value):
        back = pickle.loads(pickle.dumps(err))
        assert is_refusal(back) and isinstance(back, type(err).__mro__[1]) and str(back) == str(err)
    assert pickle.loads(pickle.dumps(refused_input)).column == "y"
    keeps = _RefusalsWithoutTracebacks().filter
    assert is_refusal(refused_input) and not keeps(record_of(refused_input))
    assert not keeps(record_of(BudgetExceeded("d", 0.1, 1.0, 8.0)))
    crash = ValueError("shapes do not match")  # raised while training: not marked
    assert not is_refusal(crash) and keeps(record_of(crash))
    # every refusal shares one base class, a spec error's included (registered: specs stands below flows)
    import specs
    from flows.checkpoints import RunLocked
    from flows.ledger import DatasetNotRegistered, RowsExposed, RowsLaundered, RowsUnrecognised
    from specs.refusal import Refusal

    for refusal in (BudgetExceeded, RunLocked, DatasetNotRegistered, RowsExposed, RowsLaundered, RowsUnrecognised,
                    specs.SpecError, type(refused_input)):
        assert issubclass(refusal, Refusal), refusal
