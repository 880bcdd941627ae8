"""A registered weights version as consumers load it (docs/design.md, "MLflow conventions"): one MLflow model
with two flavours over one copy of the weights.

- ``python_function``: flows/record/served_model.py, logged as MLflow's models from code, so loading needs
  mlflow and torch only. Input: the columns as the source stores them (their names and float64 in the
  signature; float32, integers and a plain array are accepted too); inside: the split's own preprocessing
  (``components.data.split.Preprocessing``: a declared scale or public-row statistics); output: the class label
  in the spec's names and one probability per class.
- ``pytorch``: the module itself (``mlflow.pytorch.load_model``; privzo's ``load_weights``, verify, and a run
  continued from the version read it), the same ``model.pt2`` the pyfunc runs.

This module is the flavour ``mlflow.models.Model.log`` is handed: its ``save_model`` writes the folder.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.models import Model, ModelSignature
from mlflow.types import ColSpec, Schema

from components.data.split import Preprocessing
from flows.record.promotion import folder_digests
from flows.record.tracking_names import MODEL_ARTIFACT, PRIVZO_REGISTER

CODE = Path(__file__).with_name("served_model.py")
MODULE_ARTIFACT, PREPROCESSING_ARTIFACT, TOKENIZER_ARTIFACT = "module", "preprocessing", "tokenizer"
LABEL, PROBABILITY = "label", "probability_"   # served_model.py's output columns


def requirements(prep: Preprocessing) -> List[str]:
    """What loading needs: torch and mlflow (numpy and pandas come with mlflow); a text model's tokenizer,
    transformers."""
    needs = [f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"]
    if prep.kind == "text":
        import transformers

        needs.append(f"transformers=={transformers.__version__}")
    return needs


def signature(prep: Preprocessing) -> ModelSignature:
    inputs = Schema([ColSpec(t, c) for c, t in zip(prep.columns, prep.types)])
    outputs = Schema([ColSpec("string", LABEL)] + [ColSpec("double", f"{PROBABILITY}{c}") for c in prep.classes])
    return ModelSignature(inputs=inputs, outputs=outputs)


def synthetic_example(prep: Preprocessing) -> pd.DataFrame:
    """Two all-zero rows (or two made-up texts) with the input's columns: no real row is ever logged (2 rows:
    the batch stays dynamic)."""
    if prep.kind == "text":
        return pd.DataFrame({prep.columns[0]: ["an example", "another example"]})
    return pd.DataFrame({c: np.zeros(2, dtype=np.int64 if t == "long" else np.float64)
                         for c, t in zip(prep.columns, prep.types)})


def model_input_example(prep: Preprocessing) -> torch.Tensor:
    """What the module itself takes for two rows: float features, or a text's ids and mask [2, 2, max_length]."""
    if prep.kind == "text":
        return torch.zeros((2, 2, prep.max_length), dtype=torch.int64)
    return torch.zeros((2, len(prep.columns)), dtype=torch.float32)


def input_artifacts(prep: Preprocessing, folder: Path) -> Dict[str, str]:
    """The files that turn a stored row into the module's input, written in ``folder``: the preprocessing, and
    for a text model its tokenizer (as its model's own folder holds it)."""
    out = {PREPROCESSING_ARTIFACT: str(write_preprocessing(prep, folder / "preprocessing.json"))}
    if prep.kind == "text":
        from components import pretrained

        pretrained.tokenizer(prep.tokenizer).save_pretrained(str(folder / TOKENIZER_ARTIFACT))
        out[TOKENIZER_ARTIFACT] = str(folder / TOKENIZER_ARTIFACT)
    return out


def write_preprocessing(prep: Preprocessing, path: Path) -> Path:
    """``prep`` as the served model reads it (served_model.py, ``read_preprocessing``)."""
    path.write_text(json.dumps({"kind": prep.kind, "columns": list(prep.columns), "classes": list(prep.classes),
                                "scale": prep.scale, "mean": prep.mean, "std": prep.std,
                                "max_length": prep.max_length}, indent=1))
    return path


def artifact_digests(artifacts: Dict[str, str]) -> Dict[str, str]:
    """SHA-256 of every file of ``artifacts`` (key: file or folder), keyed as served_model.file_digests keys
    them at load: by path from the artifact's parent."""
    out: Dict[str, str] = {}
    for source in map(Path, artifacts.values()):
        found = folder_digests(source) if source.is_dir() else {source.name: folder_digests(source.parent)[source.name]}
        out.update({(f"{source.name}/{k}" if source.is_dir() else k): v for k, v in found.items()})
    return out


def save_model(path: str, mlflow_model: Model, module: torch.nn.Module, preprocessing: Preprocessing,
               **kwargs: Any) -> None:
    """The model folder at ``path`` (MLflow's flavour interface): the exported module, the preprocessing, the
    pyfunc from code and the pytorch flavour over the same module. ``kwargs`` go to ``mlflow.pyfunc.save_model``."""
    module = module.cpu().eval()
    with tempfile.TemporaryDirectory(prefix="privzo-served-") as scratch:
        folder = Path(scratch, MODULE_ARTIFACT)
        folder.mkdir()
        exported = torch.export.export(module, (model_input_example(preprocessing),),
                                       dynamic_shapes=({0: torch.export.Dim.AUTO},))
        torch.export.save(exported, str(folder / "model.pt2"))
        artifacts = {MODULE_ARTIFACT: str(folder), **input_artifacts(preprocessing, Path(scratch))}
        mlflow.pyfunc.save_model(
            path, python_model=str(CODE), mlflow_model=mlflow_model, artifacts=artifacts,
            # the bytes logged, which load_context checks (declared here, so MLflow keeps the key)
            model_config={"sha256": artifact_digests(artifacts)}, pip_requirements=requirements(preprocessing),
            **kwargs)
    mlflow_model.add_flavor("pytorch", model_data=f"artifacts/{MODULE_ARTIFACT}", pytorch_version=str(torch.__version__),
                            code=None)
    mlflow_model.save(str(Path(path, "MLmodel")))


def log_served_model(module: torch.nn.Module, preprocessing: Preprocessing, registered_model_name: str):
    """Log (in the active run) and register ``module`` as the served model of ``preprocessing``'s rows."""
    return Model.log(
        artifact_path=None, name=MODEL_ARTIFACT, flavor=sys.modules[__name__],
        registered_model_name=registered_model_name,
        module=module, preprocessing=preprocessing, signature=signature(preprocessing),
        input_example=synthetic_example(preprocessing),
        metadata={PRIVZO_REGISTER: "weights"})
