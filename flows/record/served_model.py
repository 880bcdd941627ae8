"""The registered model as a consumer loads it: an MLflow pyfunc, logged from this file (MLflow's models from
code), that takes rows as the data source stores them and answers in the run's class names.

It imports numpy, pandas, torch and mlflow only, never privzo, so ``mlflow.pyfunc.load_model`` and ``mlflow models
serve`` need nothing else (a text classifier's tokenizer: transformers too). Its artifacts (flows/record/served.py
writes them):
- ``module``: the trained module as ``torch.export`` saved it (``model.pt2``), batch size dynamic;
- ``preprocessing``: ``preprocessing.json``, the split's own preprocessing (components/data/split.py,
  ``Preprocessing``): the input columns, the classes, and a declared scale or the public rows' mean and
  deviation, never a private statistic; for a text classifier, its text column and ``max_length``;
- ``tokenizer`` (a text classifier's): its model's tokenizer, as ``save_pretrained`` writes it.

``load_context`` first checks every artifact file against the SHA-256 the model was logged with (its
``model_config["sha256"]``) and refuses other bytes in one line. ``predict`` takes a DataFrame with the named
columns (other columns ignored; MLflow has cast them to the signature's types); it returns a DataFrame with
``label`` (the class name) and ``probability_<class>`` for each class.
"""
import hashlib
import json
import os

import mlflow
import numpy as np
import pandas as pd
import torch

LABEL = "label"
PROBABILITY = "probability_"


class ModifiedArtifact(ValueError):
    """An artifact of the model is not the bytes it was logged with."""


def file_digests(root: str) -> dict:
    """SHA-256 of every file under ``root`` (a file, or a folder), by its path relative to ``root``'s parent."""
    base = os.path.dirname(os.path.abspath(root))
    paths = [root] if os.path.isfile(root) else sorted(
        os.path.join(d, f) for d, _, files in os.walk(root) for f in files)
    out = {}
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out[os.path.relpath(path, base).replace(os.sep, "/")] = digest.hexdigest()
    return out


def check_artifacts(context) -> None:
    """Refuse, in one line, artifacts that are not the bytes the model was logged with (its sha256 list)."""
    expected = (context.model_config or {}).get("sha256") or {}
    found = {}
    for path in context.artifacts.values():
        found.update(file_digests(path))
    changed = sorted(p for p in set(expected) | set(found) if expected.get(p) != found.get(p))
    if not expected or changed:
        what = changed[0] if changed else "its artifacts"
        raise ModifiedArtifact(f"this model's {what} is not the bytes it was logged with "
                               f"({len(changed) or len(found)} file(s) differ from its sha256 list); not loaded")


class StoredRowsClassifier(mlflow.pyfunc.PythonModel):

    def load_context(self, context):
        check_artifacts(context)
        self.read_inputs(context.artifacts)
        self.module = torch.export.load(os.path.join(context.artifacts["module"], "model.pt2")).module()

    def read_inputs(self, artifacts: dict) -> None:
        """The preprocessing (and a text model's tokenizer) from the model's artifacts."""
        with open(artifacts["preprocessing"]) as handle:
            prep = json.load(handle)
        self.max_length = prep.get("max_length")
        if prep["kind"] == "text":
            from transformers import AutoTokenizer  # a text model's one need beyond mlflow and torch

            self.tokenizer = AutoTokenizer.from_pretrained(artifacts["tokenizer"], local_files_only=True)
        self.columns = list(prep["columns"])
        self.classes = np.asarray(prep["classes"], dtype=object)
        self.kind = prep["kind"]
        self.scale = np.float32(prep["scale"]) if prep.get("scale") is not None else None
        self.mean = np.asarray(prep["mean"], dtype=np.float32) if prep.get("mean") is not None else None
        self.std = np.asarray(prep["std"], dtype=np.float32) if prep.get("std") is not None else None

    def _inputs(self, model_input) -> np.ndarray:
        if self.kind == "text":  # as components/data/text.py's encode reads a text: ids, then the mask
            column = model_input[self.columns[0]] if isinstance(model_input, pd.DataFrame) else model_input
            lines = [str(v) for v in np.asarray(column, dtype=object).reshape(-1)]
            enc = self.tokenizer(lines, padding="max_length", truncation=True, max_length=self.max_length,
                                 return_tensors="np")
            return np.ascontiguousarray(np.stack([enc["input_ids"], enc["attention_mask"]], axis=1), dtype=np.int64)
        # read as the sources read a stored row: float64, then float32
        if isinstance(model_input, pd.DataFrame):
            named = all(c in model_input.columns for c in self.columns)
            values = model_input[self.columns] if named else model_input
            rows = values.to_numpy(dtype=np.float64)
        else:
            rows = np.asarray(model_input, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != len(self.columns):
            raise ValueError(f"expected rows of the {len(self.columns)} columns {self.columns[0]!r} .. "
                             f"{self.columns[-1]!r}, got shape {rows.shape}")
        rows = rows.astype(np.float32)
        # the split's arithmetic, in float32 (components/data/split.py, Preprocessing.apply)
        if self.kind == "fixed":
            return rows * self.scale
        if self.kind == "public":
            return ((rows - self.mean) / self.std).astype(np.float32)
        return rows

    def predict(self, context, model_input: pd.DataFrame, params=None):
        rows = torch.from_numpy(np.ascontiguousarray(self._inputs(model_input)))
        with torch.no_grad():
            logits = self.module(rows.to(next(iter(self.module.parameters()), rows).device)).cpu()
            labels = logits.argmax(dim=1).numpy()  # as the run's accuracy is scored
            probabilities = torch.softmax(logits.to(torch.float64), dim=1).numpy()
        index = model_input.index if isinstance(model_input, pd.DataFrame) else None
        answer = pd.DataFrame({LABEL: self.classes[labels].astype(str)}, index=index)
        for j, name in enumerate(self.classes):
            answer[f"{PROBABILITY}{name}"] = probabilities[:, j]
        return answer


# MLflow runs this file under a name of its own; imported as privzo's module (a transcript's pyfunc builds on the
# class), it names no model
if __name__ != "flows.record.served_model":
    mlflow.models.set_model(StoredRowsClassifier())
