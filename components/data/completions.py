"""(prompt, completion) rows for generation with a causal language model (data.source.kind completions)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from components import pretrained
from components.data.prompts import Prompt, encode_prompted
from components.data.sources import read_frame, refuse_problems
from components.data.table import Table, unique_rows
from components.data_check import file_kind, missing_column
from components.registry import SOURCES


def load_completions(path, *, file_format: str, prompt_column: str, completion_column: str, tokenizer: str,
                     max_length: int, prompt: Prompt, hf_split=None) -> Table:
    """One row per (prompt, completion): the causal LM's ids of the prompt filled into the template, then the
    completion's, with the completion's tokens marked as read (components/data/prompts.py). Every row has the
    label 0 of one class: the completion is the target, and it is part of the row's content (its
    fingerprint). Exact duplicate rows are dropped, as for every source."""
    path = Path(path)
    # both columns are read as written (text), like a file source's label and text columns
    frame = read_frame(path, file_kind(path, file_format, hf_split), prompt_column, completion_column, [], None,
                        hf_split)
    if len(frame) == 0:
        raise ValueError(f"data.source.path: {path} has no rows")
    columns = list(frame.columns)
    refuse_problems([missing_column("data.source.prompt", prompt_column, columns, path.name),
             missing_column("data.source.completion", completion_column, columns, path.name)])
    texts = {}
    for field, column in (("prompt", prompt_column), ("completion", completion_column)):
        values = frame[column]
        if values.isna().any() or not values.map(lambda v: isinstance(v, str)).all():
            raise ValueError(f"data.source.{field}: column {column!r} has missing values or values that are not text; "
                             "give every row a string")
        texts[field] = list(values)
    if any(not c.strip() for c in texts["completion"]):
        raise ValueError(f"data.source.completion: column {completion_column!r} has empty values; drop those rows")
    features = encode_prompted(texts["prompt"], pretrained.tokenizer(tokenizer), max_length, prompt,
                               completions=texts["completion"])
    layout = (f"completions:prompt={prompt_column};completion={completion_column};tokenizer={tokenizer};"
              f"max_length={max_length};{prompt.layout}")
    return unique_rows(Table(path.name, features, np.zeros(len(features), dtype=np.int64), 1, None, layout=layout))


@SOURCES.register("completions")
def _completions(source, model_tokenizer=None, public_flag=None, prompt=None):
    if prompt is None or prompt.task != "completion":
        raise ValueError("data.source.kind: completions is read by model.kind causal_lm with prompt.kind: completion")
    return load_completions(source.path, file_format=source.format, prompt_column=source.prompt,
                            completion_column=source.completion, tokenizer=model_tokenizer,
                            max_length=source.max_length, prompt=prompt, hf_split=source.hf_split), "none"
