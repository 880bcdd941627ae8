"""A registered model as its run's transcript (``tracking.register_as: transcript``): the weights rebuilt by replay.

For the runs whose trajectory is a pure function of their journal (``specs.traits.JOURNAL_ESTIMATORS`` with
``JOURNAL_OPTIMIZERS``: two_point with sgd), the trained weights are ``x_T = replay(x_0, journal)``
(docs/design.md, "The spec"; ``components.optimizers.replay``), where ``x_0`` is public: the seeded
initialisation (or the registered version the run continued), after any public warm start. A transcript
version holds the resolved spec, the journal of ``(step, seed, coefficient)`` entries, the directions stream,
the reference to ``x_0`` and a SHA-256 of the trained weights: kilobytes where the weights are megabytes or
gigabytes. Loading replays the journal and refuses, in one line, weights whose digest is not the registered one
(a privzo whose model code or direction generator changed since would rebuild other weights).

The guarantee is the run's: the transcript is post-processing of what the run released (its noisy
coefficients; the seeds are public), as the weights are. Replaying reads no private row: the data source is read
only for a public warm start's public rows.

- ``replay_weights``: the one replay, shared with ``privzo verify`` (flows/record/verify.py).
- ``TranscriptModel``: the MLflow pyfunc a transcript version is; ``mlflow.pyfunc.load_model`` replays.
- ``load_weights(model_uri)``: the torch module of a registered version, transcript or weights.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import mlflow
import mlflow.pyfunc
import numpy as np
import torch
import yaml
from mlflow.exceptions import MlflowException

import specs
from specs.traits import JOURNAL_ESTIMATORS, JOURNAL_OPTIMIZERS
from components.data.split import Preprocessing
from flows.record.served import PREPROCESSING_ARTIFACT, artifact_digests, input_artifacts
from flows.record.served import signature as served_signature
from flows.record.served_model import StoredRowsClassifier, check_artifacts
from flows.record.tracking_names import MODEL_ARTIFACT, PRIVZO_LOAD, PRIVZO_REGISTER

TRANSCRIPT_ARTIFACT = "transcript"          # the pyfunc's artifact key
TRANSCRIPT_FILE = "transcript.json"
FORMAT = "privzo-transcript/1"

# A run whose directions were drawn on a GPU (privzo.directions_stream cuda-*): the replay on a GPU draws the
# same directions, but the update kernels may round differently (a cached direction against one drawn inside
# the add), so the weights agree elementwise within |replayed - trained| <= GPU_ATOL + GPU_RTOL |trained|.
GPU_RTOL, GPU_ATOL = 1e-5, 1e-6


class ReplayError(ValueError):
    """The weights cannot be rebuilt by replay here: its one line says why."""


def journal_is_trajectory(spec: specs.RunSpec) -> bool:
    """Whether the run's journal of seeded steps is its whole trajectory (specs.traits says which kinds)."""
    return spec.estimator.kind in JOURNAL_ESTIMATORS and spec.optimizer.kind in JOURNAL_OPTIMIZERS


@dataclass(frozen=True)
class Transcript:
    spec: str                  # the resolved spec, YAML: the run's spec.yaml
    journal: List[List[Any]]   # [step, seed, coefficient] per entry (floats round-trip exactly through JSON)
    directions_stream: str     # privzo.directions_stream: cpu-torch-v2 replays on a CPU, cuda-* on a GPU
    directions_version: str    # privzo.directions_version: the generator that drew the seeds' directions
    start: str                 # x_0: "seed", or the models:/NAME/VERSION the run continued (privzo.init)
    n_features: int            # the model's shapes, so no data is read unless a public warm start needs rows
    n_classes: int
    weights_sha256: str        # of the trained weights (weights_digest): a replay that differs is refused
    run_id: str
    tracking_uri: str          # where a continued start's models:/ reference resolves by default
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Transcript":
        try:
            body = json.loads(text)
            if body.get("format") != FORMAT:
                raise ReplayError(f"transcript: format {body.get('format')!r}, this privzo reads {FORMAT}")
            return cls(**body)
        except (ValueError, TypeError, AttributeError) as err:
            if isinstance(err, ReplayError):
                raise
            raise ReplayError(f"transcript: not a privzo transcript ({str(err).splitlines()[0]})") from None

    def run_spec(self) -> specs.RunSpec:
        return specs.spec_from_dict(yaml.safe_load(self.spec))

    def entries(self) -> List[dict]:
        return [{"step": s, "seed": z, "coefficient": c} for s, z, c in self.journal]

    @property
    def shapes(self) -> Tuple[int, int]:
        return self.n_features, self.n_classes


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the state dict: every tensor's name, dtype, shape and bytes, in key order."""
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        tensor = value.detach().to("cpu").contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def weights_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's tensors: what a weights version stores (before the pickle's few hundred)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def start_of(init_tag: Optional[str]) -> str:
    """x_0 as privzo.init names it: a continued version's models:/ URI, else the seed initialisation."""
    return init_tag if init_tag and init_tag.startswith("models:/") else "seed"


def transcript_of(spec: specs.RunSpec, model: torch.nn.Module, journal, stream: str, run_id: str,
                  init_tag: Optional[str], shapes: Tuple[int, int]) -> Transcript:
    """The transcript of a finished run: its resolved spec, journal (``JournalEntry`` rows) and public start."""
    from components.directions import GENERATOR_VERSION

    return Transcript(specs.dump_yaml(spec), [[int(e.step), int(e.seed), float(e.coefficient)] for e in journal],
                      stream, str(GENERATOR_VERSION), start_of(init_tag), int(shapes[0]), int(shapes[1]),
                      weights_digest(model), run_id, spec.tracking.uri)


# ------------------------------------------------------------------ the replay (privzo verify's too)
def replay_device(stream: str, owner: str) -> torch.device:
    """Where a journal drawn on ``stream`` replays: the kind of device that drew it."""
    if stream.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ReplayError(f"{owner} drew its directions on a GPU ({stream}); replaying its journal needs a CUDA "
                              "device, and this machine has none")
        return torch.device("cuda")
    return torch.device("cpu")


def replay_weights(spec: specs.RunSpec, entries: List[dict], *, owner: str, stream: str, directions_version: str,
                   start: str, load_start: Callable[[str], Optional[torch.nn.Module]],
                   shapes: Optional[Tuple[int, int]] = None) -> Tuple[torch.nn.Module, str]:
    """The model its spec builds at the public initialisation (the seed's, or the version ``start`` names,
    loaded by ``load_start``), after any public warm start, with the journal ``entries`` replayed on the device
    that drew ``stream``; and what it started from, in words. ``owner`` names the run in errors. ``shapes``:
    (n_features, n_classes); without them the data source is read for them (rows give only their shape). Raises
    ReplayError (one line) where the weights cannot be rebuilt here."""
    from components import builders, models
    from components.directions import GENERATOR_VERSION
    from components.estimators.public import warm_start
    from components.optimizers import replay
    from components.optimizers.sgd import master_weights
    from components.runtime.loop import JournalEntry

    if not journal_is_trajectory(spec):
        raise ReplayError(f"{owner} trained {spec.estimator.kind} with {spec.optimizer.kind}: its updates are not a "
                          "journal of seeded steps alone, so its weights cannot be replayed")
    if directions_version != str(GENERATOR_VERSION):
        raise ReplayError(f"{owner}'s journal was drawn by direction generator v{directions_version}, this privzo "
                          f"draws v{GENERATOR_VERSION}: it cannot be replayed here")
    device = replay_device(stream, owner)
    warm = getattr(spec.estimator, "public_warm_start", None)
    if spec.data.blocks is not None and warm is not None:
        raise ReplayError(f"{owner} warm-started on the public rows of its window of blocks, which a replay does "
                          "not rebuild: its weights cannot be replayed here")
    data = None
    if shapes is None or warm is not None:
        try:
            data = builders.load_data(spec, every_block=True)
        except (ValueError, OSError) as err:
            raise ReplayError(f"cannot load {owner}'s data source for its model's shapes and public rows: "
                              f"{str(err).splitlines()[0]}") from None
        shapes = (data.n_features, data.n_classes)
    model = builders.build_model(spec, *shapes)
    used = "seeded initialisation"
    if start.startswith("models:/"):
        loaded = load_start(start)
        if loaded is None:
            raise ReplayError(f"{owner} continued {start}, which cannot be loaded: its weights cannot be replayed")
        model.load_state_dict(loaded.state_dict())
        used = f"weights of {start}"
    model = model.to(device)
    if warm is not None:
        features = torch.as_tensor(data.public.features, device=device)
        labels = torch.as_tensor(data.public.labels, device=device)
        warm_start(model, models.trainable_parameters(model), models.per_example_loss, features, labels,
                   epochs=warm.epochs, lr=warm.lr, batch_size=warm.batch_size, seed=spec.seed)
        used += " after its public warm start"
    directions = builders.build_directions(spec, models.trainable_parameters(model))
    if directions.stream != stream:
        raise ReplayError(f"{owner} drew its directions with {stream}, a replay here draws {directions.stream}")
    journal = [JournalEntry(int(e["step"]), int(e["seed"]), float(e["coefficient"])) for e in entries]
    opt = spec.optimizer
    replay(directions, journal, opt.lr, opt.momentum, opt.weight_decay, master_weights(spec))
    return model, used


def rebuild(transcript: Transcript, tracking_uri: Optional[str] = None, folder: Optional[Path] = None
            ) -> Tuple[torch.nn.Module, str]:
    """The weights a transcript stands for, by replay, on the device that drew its directions; and what they
    started from. On a CPU stream they must have the registered digest (bit for bit); a GPU's rounding differs
    from run to run within GPU_RTOL / GPU_ATOL, so there the digest is not compared. ``tracking_uri``: where a
    continued start resolves (default: $MLFLOW_TRACKING_URI, else the store the transcript was registered in)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "").strip() or transcript.tracking_uri
    owner = f"run {transcript.run_id}"
    try:
        spec = transcript.run_spec()
    except (specs.SpecError, ValueError, yaml.YAMLError) as err:
        raise ReplayError(f"the transcript of {owner} holds no valid spec: {str(err).splitlines()[0]}") from None
    with tempfile.TemporaryDirectory(prefix="privzo-transcript-") as scratch:
        where = Path(folder or scratch)
        model, used = replay_weights(
            spec, transcript.entries(), owner=owner, stream=transcript.directions_stream,
            directions_version=transcript.directions_version, start=transcript.start, shapes=transcript.shapes,
            load_start=lambda ref: _load_start(ref, uri, where))
    if not transcript.directions_stream.startswith("cuda") and weights_digest(model) != transcript.weights_sha256:
        raise ReplayError(f"the replay of {owner}'s journal from its {used} is not the weights it registered (their "
                          "SHA-256 differs): this privzo's model or direction code rebuilds other weights; load the "
                          "transcript with the privzo that registered it")
    return model, used


def _load_start(ref: str, tracking_uri: str, folder: Path) -> Optional[torch.nn.Module]:
    try:
        return load_weights(ref, tracking_uri=tracking_uri, folder=folder)
    except ReplayError:
        raise  # a start that is itself a transcript: its own line says why
    except (MlflowException, OSError, ValueError):
        return None


# ------------------------------------------------------------------ loading a registered version
def download_version(model_uri: str, tracking_uri: Optional[str], folder: Path) -> Path:
    """The local folder of ``model_uri`` (models:/NAME/VERSION resolved in ``tracking_uri``'s registry, or any
    artifact URI or path)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "").strip() or None
    source = model_uri
    if model_uri.startswith("models:/") and model_uri.count("/") >= 2:
        name, _, version = model_uri[len("models:/"):].rpartition("/")
        source = mlflow.MlflowClient(uri).get_model_version_download_uri(name, version)
    if os.path.isdir(source):
        return Path(source)
    dst = folder / hashlib.sha256(model_uri.encode()).hexdigest()[:16]
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst), tracking_uri=uri))


def transcript_in(model_dir: Path) -> Optional[Transcript]:
    """The transcript a downloaded model folder holds (its MLmodel's pyfunc artifact), None for weights."""
    mlmodel = Path(model_dir) / "MLmodel"
    if not mlmodel.is_file():
        return None
    flavor = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors", {}).get("python_function", {})
    path = (flavor.get("artifacts") or {}).get(TRANSCRIPT_ARTIFACT, {}).get("path")
    if not path or not (Path(model_dir) / path).is_file():
        return None
    return Transcript.from_json((Path(model_dir) / path).read_text())


def load_weights(model_uri: str, tracking_uri: Optional[str] = None, folder: Optional[Path] = None
                 ) -> torch.nn.Module:
    """The torch module of a registered version (``models:/NAME/VERSION``, or a model's artifact URI or folder):
    a transcript is replayed (``rebuild``), a weights version loaded as logged. On the CPU for a CPU stream."""
    import mlflow.pytorch

    with tempfile.TemporaryDirectory(prefix="privzo-load-") as scratch:
        where = Path(folder or scratch)
        local = download_version(model_uri, tracking_uri, where)
        transcript = transcript_in(local)
        if transcript is not None:
            return rebuild(transcript, tracking_uri, where)[0]
        return mlflow.pytorch.load_model(str(local), map_location="cpu")


# ------------------------------------------------------------------ the pyfunc a transcript version is
class TranscriptModel(StoredRowsClassifier):
    """An MLflow pyfunc holding a transcript and no weights: ``load_context`` replays the journal (``rebuild``).
    With the run's preprocessing (rows of named numbers) it answers as a weights version does (served_model.py:
    stored columns in, class label and probabilities out, its artifacts checked against their logged SHA-256);
    otherwise ``predict`` runs the module on the model's input as it is (a DataFrame as float32).
    ``model_config={"tracking_uri": ...}`` names where a continued start resolves."""

    def load_context(self, context) -> None:
        self.columns = None
        if PREPROCESSING_ARTIFACT in context.artifacts:
            check_artifacts(context)
            self.read_inputs(context.artifacts)
        self.transcript = Transcript.from_json(Path(context.artifacts[TRANSCRIPT_ARTIFACT]).read_text())
        config = getattr(context, "model_config", None) or {}
        self.model, self.started = rebuild(self.transcript, config.get("tracking_uri"))
        self.module = self.model.eval()

    # the hint only quiets MLflow's request for one: the signature logged with the model validates input, and a
    # DataFrame is taken too
    def predict(self, context, model_input: np.ndarray, params: Optional[Dict[str, Any]] = None):
        import pandas as pd

        if self.columns is not None:
            return super().predict(context, model_input, params)
        frame = isinstance(model_input, pd.DataFrame)
        rows = model_input.to_numpy(dtype=np.float32) if frame else np.asarray(model_input)
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model(torch.tensor(rows, device=device)).to("cpu").numpy()  # a copy: MLflow's are read-only
        if frame:
            return pd.DataFrame(out, index=model_input.index)
        return out


def log_transcript_model(transcript: Transcript, example: np.ndarray, output: np.ndarray,
                         registered_model_name: str, preprocessing: Optional[Preprocessing] = None):
    """Log (in the active run) and register the pyfunc of ``transcript``; ``example`` / ``output``: an all-zero
    input and the trained model's output on it, for the signature (no replay while logging). ``preprocessing``:
    rows of named numbers, which the version then takes as a weights version does (flows/record/served.py)."""
    from mlflow.models import infer_signature

    with tempfile.TemporaryDirectory(prefix="privzo-transcript-") as folder, warnings.catch_warnings():
        # no input example on purpose: MLflow would load the model to check it, which replays the journal
        warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
        path = Path(folder, TRANSCRIPT_FILE)
        path.write_text(transcript.to_json())
        artifacts = {TRANSCRIPT_ARTIFACT: str(path)}
        # declared, so a loader may name the store a continued start resolves in (MLflow drops undeclared keys)
        config: Dict[str, Any] = {"tracking_uri": ""}
        if preprocessing is None:
            signature = infer_signature(example, output)
        else:
            artifacts.update(input_artifacts(preprocessing, Path(folder)))
            config["sha256"] = artifact_digests(artifacts)
            signature = served_signature(preprocessing)
        return mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT, python_model=TranscriptModel(), artifacts=artifacts,
            signature=signature, registered_model_name=registered_model_name,
            metadata={PRIVZO_REGISTER: "transcript", PRIVZO_LOAD: "flows.record.transcript.load_weights"},
            model_config=config,
            # loading replays with privzo's own code, so privzo must be importable where it loads
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"])


def replays_to(transcript: Transcript, trained: torch.nn.Module, tracking_uri: Optional[str] = None) -> Optional[str]:
    """None when loading ``transcript`` rebuilds ``trained`` (bit for bit on a CPU stream, within GPU_RTOL /
    GPU_ATOL on a GPU); else the one line why not. Run before registering, so no transcript loads as other weights."""
    try:
        rebuilt, _ = rebuild(transcript, tracking_uri)
    except ReplayError as err:
        return str(err)
    if transcript.directions_stream.startswith("cuda"):
        mine, theirs = rebuilt.state_dict(), trained.state_dict()
        if set(mine) != set(theirs) or not all(
                torch.allclose(mine[k].detach().cpu(), theirs[k].detach().cpu(), rtol=GPU_RTOL, atol=GPU_ATOL)
                for k in mine):
            return (f"the replay of run {transcript.run_id}'s journal is not the trained weights within rtol "
                    f"{GPU_RTOL:g}, atol {GPU_ATOL:g}")
    return None
