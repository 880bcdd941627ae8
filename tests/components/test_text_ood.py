"""Public text from another distribution: the Italian chatterbot corpus, labelled with the English topics,
as data.split.kind source beside the English corpus (PAZO's out-of-distribution regime)."""
from dataclasses import replace

import numpy as np
import pytest

import specs
from components import builders, pretrained
from components.data.split import SplitOverlapError, source_split
from components.data.text import chatterbot_english, _chatterbot_italian, encode, load_text, read_topics, tokenised
from tests.conftest import EXAMPLES

LENGTH = 16  # short rows: the same checks, less tokenising


@pytest.fixture(scope="module")
def corpora():
    return load_text("chatterbot", LENGTH, "minilm"), load_text("chatterbot_italian", LENGTH, "minilm")


@pytest.fixture(scope="module")
def english_topics():
    return [topic for topic, _lines in read_topics(chatterbot_english())]


def test_italian_rows_carry_the_english_label_of_their_topic(corpora, english_topics):
    _english, italian = corpora
    assert italian.n_classes == len(english_topics) == 21
    tokenizer = pretrained.tokenizer("minilm")
    italian_topics = dict(read_topics(_chatterbot_italian()))
    keys = {row.tobytes(): int(label) for row, label in zip(italian.features, italian.labels)}
    for topic in ("food", "sports", "trivia"):  # the Italian file order shifts these by one or two
        rows = encode(italian_topics[topic], tokenizer, LENGTH)
        found = [keys[row.tobytes()] for row in rows if row.tobytes() in keys]
        assert found and set(found) == {english_topics.index(topic)}, topic


def test_topics_missing_in_italian_have_no_rows_and_the_others_have_some(corpora, english_topics):
    _english, italian = corpora
    counts = np.bincount(italian.labels, minlength=italian.n_classes)
    absent = {english_topics.index("coding"), english_topics.index("tech_support")}
    assert {k for k in range(italian.n_classes) if counts[k] == 0} == absent


def test_lines_both_corpora_have_are_left_out_of_the_private_side_only(corpora):
    """Untranslated lines ('No.', names) are in both corpora under the same topic. The public source keeps
    them all; with shared_rows drop_private the English copies leave the private and test parts (a rule on
    each English row and the public rows alone), and by default the overlap is refused."""
    english, italian = corpora
    italian_keys = {row.tobytes() + bytes([int(y)]) for row, y in zip(italian.features, italian.labels)}
    shared = [i for i, (row, y) in enumerate(zip(english.features, english.labels))
              if row.tobytes() + bytes([int(y)]) in italian_keys]
    assert 0 < len(shared) < 100 and len(italian) > 1000
    with pytest.raises(SplitOverlapError, match="some rows appear in both"):
        source_split(english, italian, test=0.2, seed=0, scale="none")
    data = source_split(english, italian, test=0.2, seed=0, scale="none", drop_shared=True)
    assert len(data.public) == len(italian)
    assert len(data.private) + len(data.test) == len(english) - len(shared)
    assert not set(data.public.fingerprints) & (set(data.private.fingerprints) | set(data.test.fingerprints))
    # an English row's part does not depend on which other rows were dropped: the same rows are test
    kept = np.setdiff1d(np.arange(len(english)), shared)
    alone = source_split(replace(english, features=english.features[kept], labels=english.labels[kept]), italian,
                         test=0.2, seed=0, scale="none")
    assert sorted(alone.test.fingerprints) == sorted(data.test.fingerprints)
    assert data.n_classes == 21 and data.public.features.shape[1:] == data.private.features.shape[1:]
    assert set(np.unique(data.public.labels)) <= set(np.unique(data.private.labels))


def test_italian_in_its_own_class_order_is_refused(corpora):
    """What the English class order buys: read alone, the Italian corpus has 19 classes, not 21."""
    english, _italian = corpora
    own = tokenised("it", read_topics(_chatterbot_italian()), pretrained.tokenizer("minilm"), LENGTH)
    with pytest.raises(ValueError, match=r"^data.split.public_source: 19 classes, the main source has 21$"):
        source_split(english, own, test=0.2, seed=0, scale="none")


def test_a_topic_outside_the_classes_is_one_line():
    with pytest.raises(ValueError, match=r"^data.source: it: topic 'weather' is not one of its classes; allowed: a, b$"):
        tokenised("it", [("a", ["x"]), ("weather", ["y"])], pretrained.tokenizer("minilm"), LENGTH,
                  classes=["a", "b"])


@pytest.mark.parametrize("name, split", [("chatterbot_minilm_pazo_m_id.yaml", "fraction"),
                                         ("chatterbot_minilm_pazo_m_ood.yaml", "source")])
def test_the_pazo_m_examples_validate(name, split):
    spec = specs.load_spec(EXAMPLES / name)
    assert spec.estimator.kind == "pazo_m" and spec.data.split.kind == split and spec.privacy.epsilon == 2.0
    if split == "source":
        assert spec.data.split.public_source.name == "chatterbot_italian"


def test_the_ood_example_loads_with_italian_public_rows():
    spec = specs.load_spec(EXAMPLES / "chatterbot_minilm_pazo_m_ood.yaml")
    data = builders.load_data(spec)
    assert len(data.private) == spec.data.declared_private_rows  # the count its comment and N were set from
    assert len(data.public) > 1000 and data.layout == "text:chatterbot;tokenizer=minilm;max_length=32"
