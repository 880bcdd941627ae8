"""Text sources that work offline: short lines labelled by topic, as fixed-length token ids.

A row's features are an int64 array [2, max_length]: token ids, then the attention mask. Rows stay plain
arrays, so the split, the content fingerprints and index-based batches work as for tabular sources.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml

from components import pretrained
from components.data.prompts import Prompt, encode_prompted
from components.data.table import Table
from components.data_check import TEXT_CORPORA, corpus_folder, topic_files, topic_problem
from components.registry import SOURCES


def chatterbot_english() -> Path:
    return corpus_folder("chatterbot")


def _chatterbot_italian() -> Path:
    return corpus_folder("chatterbot_italian")


@dataclass(frozen=True)
class Corpus:
    directory: Callable[[], Path]  # its topic files
    # the registered corpus this one translates, or None: its topic files name the classes, in its order,
    # so the two can be one run's private and public sources (data.split.kind: source) with the same classes
    translates: Optional[str] = None


# name -> corpus (a closed registry: a spec never names a path to read; components/data_check.TEXT_CORPORA
# holds each one's folder and what it translates, which validate reads too). The Italian corpus has 19 of
# the English corpus's 21 topics (no coding, no tech_support): those two classes have no Italian rows.
CORPORA: Dict[str, Corpus] = {name: Corpus(partial(corpus_folder, name), translates)
                              for name, (_folder, translates) in TEXT_CORPORA.items()}


def read_topics(directory: Path) -> List[Tuple[str, List[str]]]:
    """(topic, lines) for each ``*.yml``/``*.yaml`` file of a chatterbot-style corpus, in file-name order
    (so labels are stable): the topic is the file name, the lines are every line of every conversation
    (``conversations: [[line, line, ...], ...]``). YAML's base loader keeps each line as written: 'Yes'
    or '1.0' stay text instead of becoming a boolean or a number."""
    directory = Path(directory)
    paths = topic_files(directory)
    if not paths:
        raise ValueError(f"data.source: no .yml topic files in {directory}")
    topics = []
    for path in paths:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)  # noqa: S506 - no objects
        conversations = doc.get("conversations") if isinstance(doc, dict) else None
        if isinstance(conversations, list):
            # a conversation is a list of lines; a lone line (a quoting slip in the packaged corpus) is one
            conversations = [[c] if isinstance(c, str) else c for c in conversations]
        if not conversations or not all(isinstance(c, list) and all(isinstance(line, str) for line in c)
                                        for c in conversations):
            raise ValueError(f"data.source: {path.name}: expected 'conversations:' as a list of lists of lines")
        topics.append((path.stem, [line.strip() for c in conversations for line in c if line.strip()]))
    return topics


def encode(lines: List[str], tokenizer, max_length: int) -> np.ndarray:
    """int64 [n, 2, max_length]: each line's token ids, padded or truncated, then its attention mask."""
    enc = tokenizer(lines, padding="max_length", truncation=True, max_length=max_length, return_tensors="np")
    return np.ascontiguousarray(np.stack([enc["input_ids"], enc["attention_mask"]], axis=1), dtype=np.int64)


def tokenised(name: str, topics: List[Tuple[str, List[str]]], tokenizer, max_length: int, *,
              classes: Optional[Sequence[str]] = None, prompt: Optional[Prompt] = None) -> Table:
    """One row per line, labelled by its topic's position; ids and mask padded/truncated to ``max_length``.

    Content is what the model reads (the ids after truncation). Repeated content keeps its first row;
    content found under two topics is dropped whole, since it has no single label. Either way no content
    can land in two splits, which are checked disjoint on content fingerprints.

    ``classes`` (topic names) labels a topic by its position there instead, so a corpus of the same task
    gives the same classes; a class without a topic simply has no rows. ``prompt``: a language model's rows,
    each line filled into its template (components/data/prompts.py).
    """
    names = [topic for topic, _lines in topics] if classes is None else list(classes)
    stray = [topic for topic, _lines in topics if topic not in names]
    if stray:
        raise ValueError(f"data.source: {name}: topic {stray[0]!r} is not one of its classes; allowed: "
                         f"{', '.join(names)}")
    lines = [line for _topic, topic_lines in topics for line in topic_lines]
    if not lines:
        raise ValueError(f"data.source: {name} has no lines")
    labels = np.asarray([names.index(topic) for topic, topic_lines in topics for _ in topic_lines], dtype=np.int64)
    features = encode(lines, tokenizer, max_length) if prompt is None else encode_prompted(
        lines, tokenizer, max_length, prompt)
    first: Dict[bytes, int] = {}
    label_sets: Dict[bytes, set] = {}
    for i in range(len(lines)):
        key = features[i].tobytes()
        first.setdefault(key, i)
        label_sets.setdefault(key, set()).add(int(labels[i]))
    keep = np.asarray(sorted(i for key, i in first.items() if len(label_sets[key]) == 1), dtype=np.int64)
    return Table(name, features[keep], labels[keep], len(names), None, label_names=tuple(names))


def only_topics(table: Table, classes: Sequence[str], topics: Sequence[str]) -> Table:
    """The rows of ``topics`` alone, labelled by their position in ``topics``; a row keeps its identity by
    its topic's name (``class_names``), so the same line is the same row whichever topics a run selects.
    The selection reads the spec and the corpus's file names, never a row's content."""
    position = {classes.index(topic): i for i, topic in enumerate(topics)}
    keep = np.flatnonzero(np.isin(table.labels, list(position)))
    labels = np.asarray([position[int(label)] for label in table.labels[keep]], dtype=np.int64)
    return replace(table.take(keep), labels=labels, n_classes=len(topics), class_names=tuple(topics))


def load_text(name: str, max_length: int, tokenizer: str, prompt: Optional[Prompt] = None,
              topics: Optional[Sequence[str]] = None) -> Table:
    """A registered corpus's rows. ``topics`` (data.source.topics): only those classes' rows, in that order.
    Repeated and ambiguous lines are dropped over the whole corpus first (``tokenised``), so a topic's rows
    do not depend on which other topics are selected."""
    if name not in CORPORA:
        raise ValueError(f"data.source.name: unknown text corpus {name!r}; allowed: {', '.join(CORPORA)}")
    corpus = CORPORA[name]
    read = read_topics(corpus.directory())
    classes = [topic for topic, _ in (read if corpus.translates is None else
                                       read_topics(CORPORA[corpus.translates].directory()))]
    if topics is not None:
        problem = topic_problem(name, topics, classes)
        if problem:
            raise ValueError(problem)
    table = tokenised(name, read, pretrained.tokenizer(tokenizer), max_length,
                      classes=None if corpus.translates is None else classes, prompt=prompt)
    layout = f"text:{name};tokenizer={tokenizer};max_length={max_length}"
    if topics is not None:
        table = only_topics(table, classes, topics)
        if not len(table):
            raise ValueError(f"data.source.topics: {name} has no lines of {', '.join(topics)}; choose topics it has")
        layout += ";classes=by-name"  # a row's fingerprint holds its topic's name, not its position
    # a served model reads a "text" column (the corpus's lines) as these were read
    return replace(table, layout=layout if prompt is None else f"{layout};{prompt.layout}",
                   text_input=None if prompt is not None else ("text", tokenizer, max_length))


@SOURCES.register("text")
def _text(source, model_tokenizer=None, public_flag=None, prompt=None):
    # ids: no scale
    return load_text(source.name, source.max_length, source.tokenizer or model_tokenizer, prompt,
                     source.topics), "none"
