"""Text source: chatterbot-style YAML parsing, tokenised rows, duplicates, the packaged corpus offline."""
import copy
from dataclasses import replace

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
    with pytest.raises(ValueError, match=r"^data.source.name: unknown text corpus 'reddit'; allowed: chatterbot, chatterbot_italian$"):
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


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl", ".hf"])
def test_a_files_text_column_becomes_the_tokenizers_ids(tmp_path, minilm_tokenizer, suffix):
    """The team's own texts: one row per line, the same ids and mask the packaged corpus gets."""
    import pandas as pd

    from components.data import load_file
    from components.data.text import chatterbot_english, encode

    topics = read_topics(chatterbot_english())[:3]
    lines = [line for _t, ls in topics for line in ls] + ["NA", "None", "1.0"]  # text as written, never parsed
    labels = [t for t, ls in topics for _ in ls] + [topics[0][0]] * 3
    path = tmp_path / f"tickets{suffix}"
    frame = pd.DataFrame({"body": lines, "topic": labels})
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".hf":
        from tests.conftest import save_to_disk

        save_to_disk(frame, path)
    else:
        frame.to_parquet(path)
    classes = [t for t, _ in topics]
    table = load_file(path, file_format="auto", label="topic", classes=classes, text="body", tokenizer="minilm",
                      max_length=16)
    expected = encode(lines, minilm_tokenizer, 16)
    keys = {row.tobytes() + int(y).to_bytes(8, "little") for row, y in zip(expected, [classes.index(t) for t in labels])}
    assert len(table) == len(keys)  # exact repeats (same ids, same topic) kept once
    assert {row.tobytes() + int(y).to_bytes(8, "little") for row, y in zip(table.features, table.labels)} == keys
    assert table.n_classes == 3 and table.features.dtype == np.int64


def test_a_text_column_with_gaps_or_a_wrong_name_is_one_line(tmp_path):
    import pandas as pd

    from components.data import load_file

    path = tmp_path / "t.csv"
    pd.DataFrame({"body": ["hello", "", "bye"], "topic": ["a", "b", "a"]}).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"^data.source.text: column 'body' has missing or empty values"):
        load_file(path, file_format="csv", label="topic", classes=["a", "b"], text="body", tokenizer="minilm")
    with pytest.raises(ValueError, match=r"^data.source.text: no column 'text' in t.csv; columns: body, topic$"):
        load_file(path, file_format="csv", label="topic", classes=["a", "b"], text="text", tokenizer="minilm")


def test_hf_runs_on_a_files_text_column(tmp_path, tiny_spec_dict):
    import pandas as pd
    import torch

    from components.randomness import private_generator

    path = tmp_path / "tickets.parquet"
    lines = [f"ticket {i} about {'billing' if i % 2 else 'login'} problem number {i * 7}" for i in range(400)]
    pd.DataFrame({"body": lines, "queue": ["billing" if i % 2 else "login" for i in range(400)]}).to_parquet(path)
    tiny_spec_dict["data"] = {"declared_private_rows": 1000, "source": {"kind": "file", "path": str(path), "label": "queue",
                                         "classes": ["login", "billing"], "text": "body", "max_length": 16},
                              "split": {"kind": "hashed", "public": 0.05, "test": 0.2}}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "head"}
    tiny_spec_dict["sampling"]["expected_batch_size"] = 16
    tiny_spec_dict["optimizer"] = {"kind": "sgd", "lr": 1e-2, "steps": 3}
    spec = specs.spec_from_dict(tiny_spec_dict)
    data = builders.load_data(spec)
    assert data.private.features.shape[1:] == (2, 16) and data.n_classes == 2
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, noise_generator=private_generator(1), sampling_generator=private_generator(2))
    before = built.model.head.weight.detach().clone()
    built.loop.run(3)
    assert not torch.equal(before, built.model.head.weight)


@pytest.mark.parametrize("source, model, message", [
    ({"text": "body", "features": ["a"]}, "hf", "a text column is the whole input: remove features and scale"),
    ({"text": "body", "scale": "public"}, "hf", "a text column is the whole input"),
    ({"max_length": 16}, "linear", "max_length applies to a text column only"),
    ({"text": "body"}, "linear", "data.source.text gives token ids, which model.kind linear cannot read"),
    ({}, "hf", "model.kind: hf reads token ids; use data.source.kind: text, or a file or sql source with a text column"),
])
def test_text_column_spec_errors(tiny_spec_dict, source, model, message):
    tiny_spec_dict["data"]["source"] = {"kind": "file", "path": "t.csv", "label": "y", "classes": [0, 1], **source}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm"} if model == "hf" else {"kind": model}
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)


def test_a_jsonl_text_column_of_objects_is_refused(tmp_path):
    from components.data import load_file

    path = tmp_path / "t.jsonl"
    path.write_text('{"body": "hello", "topic": "a"}\n{"body": {"x": 1}, "topic": "b"}\n')
    with pytest.raises(ValueError, match="^data.source.text: column 'body' holds values that are not text"):
        load_file(path, file_format="auto", label="topic", classes=["a", "b"], text="body", tokenizer="minilm")


def test_topics_keep_only_those_classes_rows_in_the_order_given():
    """data.source.topics: the rows of those topics of the whole corpus (repeats and ambiguous lines dropped
    over the whole corpus first), labelled by position in the list; a row's identity holds its topic's name,
    so the same line is the same row in any selection or order."""
    from components.data_check import corpus_classes

    whole = load_text("chatterbot", 16, "minilm")
    some = load_text("chatterbot", 16, "minilm", topics=["sports", "food"])
    other = load_text("chatterbot", 16, "minilm", topics=["food", "history", "sports"])
    classes = corpus_classes("chatterbot")
    assert some.n_classes == 2 and some.class_names == ("sports", "food") and "classes=by-name" in some.layout
    for i, topic in enumerate(["sports", "food"]):
        rows = whole.features[whole.labels == classes.index(topic)]
        assert np.array_equal(some.features[some.labels == i], rows) and len(rows) > 0
    assert other.n_classes == 3 and np.bincount(other.labels).tolist()[0] == int((some.labels == 1).sum())
    named = dict(zip(some.row_fingerprints(), some.labels.tolist()))
    shared = set(named) & set(other.row_fingerprints())
    assert len(shared) == len(some)  # every sports and food row, whatever else is selected


def test_an_unknown_topic_is_refused_in_one_line_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"^data.source.topics: 'cooking' is not a topic of chatterbot; allowed: ai, "
                                         r"botprofile, coding, .*, trivia$"):
        load_text("chatterbot", 16, "minilm", topics=["food", "cooking"])
    # the Italian corpus's classes are the English topics: coding has no Italian rows, and is a class all the same
    italian = load_text("chatterbot_italian", 16, "minilm", topics=["sports", "coding"])
    assert italian.n_classes == 2 and np.bincount(italian.labels, minlength=2).tolist()[1] == 0
    with pytest.raises(ValueError, match=r"^data.source.topics: chatterbot_italian has no lines of coding, "
                                         r"tech_support; choose topics it has$"):
        load_text("chatterbot_italian", 16, "minilm", topics=["coding", "tech_support"])


def test_a_topic_selection_sets_the_class_count_of_the_run(tiny_spec_dict):
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot", "max_length": 16,
                                        "topics": ["greetings", "food", "sports"]}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "head"}
    spec = specs.spec_from_dict(tiny_spec_dict)
    data = builders.load_data(spec)
    assert data.n_classes == 3 and set(np.unique(data.private.labels).tolist()) == {0, 1, 2}
    model = builders.build_model(spec, data.n_features, data.n_classes)
    import torch

    with torch.no_grad():
        assert model(torch.as_tensor(data.test.features[:4])).shape == (4, 3)


@pytest.mark.parametrize("public_topics, message", [
    (None, r"^data.split.public_source.topics: must be data.source.topics, in the same order \(select the same "
           r"topics in both, or in neither\)"),
    (["food", "sports"], r"^data.split.public_source.topics: must be data.source.topics, in the same order$"),
])
def test_a_public_text_source_selects_the_same_topics(tiny_spec_dict, public_topics, message):
    """A label is a position among the classes: public rows of another selection would carry other classes."""
    public = {"kind": "text", "name": "chatterbot_italian", **({"topics": public_topics} if public_topics else {})}
    tiny_spec_dict["data"] = {"declared_private_rows": 1000, "split": {"kind": "source", "public_source": public},
                              "source": {"kind": "text", "name": "chatterbot", "topics": ["sports", "food"]}}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm"}
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)
    public["topics"] = ["sports", "food"]
    specs.spec_from_dict(tiny_spec_dict)


def test_a_public_source_whose_classes_are_others_is_refused_when_split(minilm_tokenizer):
    """Below the rule: two tables with the same number of classes in another order are refused, not relabelled."""
    from components.data import source_split

    topics = [("food", ["Do you like bread?", "Soup is warm."]), ("sports", ["Who won the match?", "Run fast."])]
    private = tokenised("p", topics, minilm_tokenizer, 8)
    mine = replace(private, class_names=("food", "sports"))
    theirs = replace(tokenised("q", topics[::-1], minilm_tokenizer, 8, classes=["sports", "food"]),
                     class_names=("sports", "food"))
    with pytest.raises(ValueError, match=r"^data.split.public_source: its classes are sports, food, the main "
                                         r"source's food, sports; give both the same, in the same order$"):
        source_split(mine, theirs, test=0.2, seed=0, scale="none")
