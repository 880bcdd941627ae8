"""Text source: chatterbot-style YAML parsing, tokenised rows, duplicates, the packaged corpus offline."""
import copy

import numpy as np
import pytest

import specs
from components import builders, pretrained
from components.data.text import load_text, read_topics, tokenised


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return pretrained.tokenizer("minilm")


def _write(directory, name, text):
    (directory / name).write_text(text, encoding="utf-8")


def test_read_topics_takes_every_line_as_text_in_file_order(tmp_path):
    _write(tmp_path, "b_sports.yml", "categories: [sports]\nconversations:\n- - Do you like football?\n  - Yes\n"
                                     "- - Score?\n  - 1.0\n")
    _write(tmp_path, "a_food.yaml", "conversations:\n- - What do you eat?\n  - '  Bread. '\n- A lone line\n")
    _write(tmp_path, "notes.txt", "not a topic")
    topics = read_topics(tmp_path)
    assert [t for t, _ in topics] == ["a_food", "b_sports"]
    assert topics[0][1] == ["What do you eat?", "Bread.", "A lone line"]
    assert topics[1][1] == ["Do you like football?", "Yes", "Score?", "1.0"]  # no booleans, no floats


@pytest.mark.parametrize("text", ["categories: [x]\n", "conversations: {a: b}\n", "- - a\n", "conversations:\n- - [a, b]\n"])
def test_read_topics_rejects_other_shapes_in_one_line(tmp_path, text):
    _write(tmp_path, "bad.yml", text)
    with pytest.raises(ValueError, match=r"^data.source: bad.yml: expected 'conversations:' as a list of lists of lines$"):
        read_topics(tmp_path)


def test_read_topics_needs_topic_files(tmp_path):
    with pytest.raises(ValueError, match="no .yml topic files"):
        read_topics(tmp_path)


def test_rows_are_ids_and_mask_with_repeats_and_ambiguous_lines_dropped(minilm_tokenizer):
    long = "word " * 40
    topics = [("ai", ["What is AI?", "What is AI?", "Hello", long + "one", "Sort of."]),
              ("greetings", ["Hello", "Good morning", long + "two"])]
    table = tokenised("toy", topics, minilm_tokenizer, max_length=8)
    assert table.features.shape == (3, 2, 8) and table.features.dtype == np.int64
    # kept: 'What is AI?' (once), 'Sort of.', 'Good morning'; 'Hello' is under both topics, and the two
    # long lines read the same after truncation to 8 tokens, so they are dropped as ambiguous too
    assert table.labels.tolist() == [0, 0, 1] and table.n_classes == 2
    ids, mask = table.features[:, 0], table.features[:, 1]
    assert ids[0].tolist() == minilm_tokenizer("What is AI?", padding="max_length", max_length=8)["input_ids"]
    assert mask[0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0] and (ids[mask == 0] == minilm_tokenizer.pad_token_id).all()
    assert len(set(table.row_fingerprints())) == 3


def test_chatterbot_loads_offline_and_deterministically():
    a = load_text("chatterbot", 32, "minilm")
    b = load_text("chatterbot", 32, "minilm")
    assert a.n_classes == 21 and 1500 < len(a) < 4419  # 4,419 lines in the package, many repeated
    assert a.features.shape[1:] == (2, 32) and np.array_equal(a.features, b.features)
    assert np.array_equal(a.labels, b.labels) and np.bincount(a.labels).min() > 0
    assert len(set(a.row_fingerprints())) == len(a)
    assert (a.features[:, 1, 0] == 1).all()  # every row starts with [CLS]


def test_unknown_corpus_is_one_line():
    with pytest.raises(ValueError, match=r"^data.source.name: unknown text corpus 'reddit'; allowed: chatterbot$"):
        load_text("reddit", 32, "minilm")
    with pytest.raises(ValueError, match=r"^model.name: unknown pretrained model 'bert'; allowed: minilm$"):
        pretrained.tokenizer("bert")


def test_text_split_is_seeded_disjoint_and_unscaled(tiny_spec_dict):
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot", "max_length": 16}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm"}
    spec = specs.spec_from_dict(tiny_spec_dict)
    a, b = builders.load_data(spec), builders.load_data(spec)
    assert a.fingerprints == b.fingerprints
    other = copy.deepcopy(tiny_spec_dict)
    other["seed"] += 1
    assert builders.load_data(specs.spec_from_dict(other)).fingerprints != a.fingerprints
    assert a.private.features.dtype == np.int64 and a.private.features.shape[1:] == (2, 16)
    parts = [set(p.fingerprints) for p in (a.public, a.private, a.test)]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert len(a.public) > 0 and a.n_classes == 21
