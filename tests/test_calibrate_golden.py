"""`privzo calibrate` prints, for every shipped spec, exactly what it printed before the package redesign
(tests/golden/calibrate/, recorded from main at f23a888; specs added since, when they were added): the redesign
moved code, not numbers. Two phrases
of the nonsmooth family's directions line were reworded on purpose (they cited a document a reader does not
have, and a paper by number); every number is as recorded. The memory plan printed last (components/memory_plan.py,
since) is not part of the recorded output: it holds the machine's free memory; tests/components/test_memory.py
checks it."""
from __future__ import annotations

import json

import pytest

from components import builders
from flows import cli
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "calibrate"
# the language-model examples' decoder is made by recipes/pretrain_decoder.py, not shipped: their calibrate
# runs on a tiny one in tests/flows/test_lm_examples.py
SPECS = sorted(p for p in (ROOT / "specs").glob("*/*.yaml") if not p.name.startswith("chatterbot_lm_"))


def _golden(spec_path):
    return GOLDEN / f"{spec_path.parent.name}__{spec_path.stem}.txt"


def test_every_shipped_spec_has_a_golden_output():
    assert sorted(_golden(p).name for p in SPECS) == sorted(p.name for p in GOLDEN.glob("*.txt"))


_LOADED = {}
_load_data = builders.load_data


def _shared_load(spec, select=None, every_block=False, within=None):
    """The specs of one comparison share their data (27 of them three datasets): each is loaded once."""
    key = json.dumps([spec.seed, spec.data.model_dump(mode="json"), spec.model.model_dump(mode="json")])
    if key not in _LOADED:
        _LOADED[key] = _load_data(spec, select, every_block, within)
    return _LOADED[key]


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_calibrate_prints_the_golden_output(spec_path, capsys, monkeypatch):
    monkeypatch.setattr(builders, "load_data", _shared_load)
    assert cli.main(["calibrate", str(spec_path)]) == 0
    out = capsys.readouterr().out
    assert out.split("peak memory (estimate):")[0] == _golden(spec_path).read_text()
