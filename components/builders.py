"""Turn resolved spec sections into components: lookups in the section registries (components/registry.py),
where each kind's module registered its builder, and the run's family (components/families/) for its plan."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from components import models
from components.data import SplitData
from components.data.split import WindowRows
from components.devices import CACHE_LIMIT_BYTES, device_for  # noqa: F401 (the builders' API too)
from components.data.prompts import prompt_of
from components.data.table import Table
from components.directions import Directions
from components.estimators.public import PublicOracle, too_few_public_rows, warm_start
from components.families import family_for
from components.families.common import accountant, calibrate_sigma, spec_sampler  # noqa: F401 (planning API)
from components.randomness import (
    STREAM_INIT,
    STREAM_INSECURE_PRIVATE,
    SecureSource,
    noise_source,
    private_generator,
    public_seed,
)
from specs.traits import reads_by_window
from components.registry import ESTIMATORS, MECHANISMS, MODELS, OPTIMIZERS, SOURCES, SPLITS, Assembly
from components.runtime import LocalBackend, PrivateLoop
from specs import RunSpec
from specs.traits import ESTIMATORS as ESTIMATOR_TRAITS, MODELS as MODEL_TRAITS, NONSMOOTH


def load_data(spec: RunSpec, select: Optional[Callable[[Table], np.ndarray]] = None,
              every_block: bool = False, within=None) -> SplitData:
    """The spec's rows, split. ``select``: with data.blocks, the rows of the run's window (their indices),
    chosen before the split, so rows of other blocks are in no part at all. ``every_block``: every row,
    for checks that train nothing and release nothing (privzo validate and calibrate, a run's preflight:
    N is declared, and the rows give only their shape and classes). ``within``: the window's [start, end),
    for a source that reads by window (a database's WHERE); ``select`` still chooses the rows exactly."""
    split = spec.data.split
    model_tokenizer, prompt = _reading(spec)
    table, scale = _table(spec.data.source, model_tokenizer, split.column if split.kind == "column" else None,
                          spec.data.blocks, prompt,
                          within if reads_by_window(spec.data.source) and not every_block else None)
    window_rows = None
    if spec.data.blocks is not None and not every_block:
        if select is None:
            raise ValueError("data.blocks: a run on blocks reads the rows of its window, which the private-train "
                             "flow chooses and charges; run it with privzo run or a deployment (sweeps and audits "
                             "do not read blocks)")
        positions = np.asarray(select(table), dtype=np.int64)
        window_rows = WindowRows(within if reads_by_window(spec.data.source) else None, positions)
        table = table.take(positions)
    data = SPLITS[split.kind](spec, table, scale, lambda source: _table(source, model_tokenizer, prompt=prompt))
    return data if window_rows is None else dataclasses.replace(data, window_rows=window_rows)


def source_table(spec: RunSpec) -> Table:
    """Every row of the spec's main source as a run reads it before it chooses its window or splits (the
    ledger's id migration keys them)."""
    split = spec.data.split
    model_tokenizer, prompt = _reading(spec)
    return _table(spec.data.source, model_tokenizer, split.column if split.kind == "column" else None,
                  spec.data.blocks, prompt)[0]


def _reading(spec: RunSpec):
    # a file's text column is tokenised by the model's own tokenizer unless the source names one, and a
    # language model's rows are its prompt filled with each text
    model_tokenizer = spec.model.weights if MODEL_TRAITS[spec.model.kind].reads == "tokens" else None
    return model_tokenizer, prompt_of(spec.model)


def _no_public_rows(spec: RunSpec) -> str:
    split = spec.data.split
    if split.kind == "column":
        return f"no row is flagged public in column {split.column!r}"
    if split.kind == "source":
        return "data.split.public_source gave none"
    return "the split gave none; set data.split.public > 0"


def _table(source, model_tokenizer: Optional[str], public_flag: Optional[str] = None, blocks=None, prompt=None,
           within=None):
    """The source's rows and how to scale them; ``blocks`` (data.blocks, file sources only) adds their
    arrival and person columns; ``prompt`` (a language model's; text sources only) fills its template."""
    extra = {k: v for k, v in (("blocks", blocks), ("prompt", prompt), ("within", within)) if v is not None}
    return SOURCES[source.kind](source, model_tokenizer, public_flag, **extra)


def meta_model(spec: RunSpec, n_features: int, n_classes: int) -> torch.nn.Module:
    """Shapes only, nothing allocated (module constructors would also draw from the global RNG)."""
    return MODELS[spec.model.kind](spec, n_features, n_classes, None)


def check_model(spec: RunSpec, n_features: int, n_classes: int, memory_bytes: int) -> None:
    """A model that cannot be built for this data, or whose parameters alone exceed ``memory_bytes``,
    fails here in one line instead of deep in training. Pretrained (hf) models are their package's or
    folder's size; only where they are is checked."""
    if MODEL_TRAITS[spec.model.kind].pretrained:
        from components import pretrained

        pretrained.model_path(spec.model.weights)
        if prompt_of(spec.model) is not None:  # a language model: its architecture, adapters and label words
            from components.models.lm import check_language_model

            check_language_model(spec.model, n_classes)
            return
        if spec.model.lora is not None:
            lora = spec.model.lora
            models.check_adapter_targets(pretrained.encoder_skeleton(spec.model.weights), lora.targets, lora.rank)
        return
    model = meta_model(spec, n_features, n_classes)
    n = sum(p.numel() for p in model.parameters())
    need = n * 4  # float32
    if need > memory_bytes:
        raise ValueError(f"model: {n:.3g} parameters need {need / 2**30:.3g} GiB, more than this machine's "
                         f"{memory_bytes / 2**30:.3g} GiB of memory; make the model smaller")


def build_model(spec: RunSpec, n_features: int, n_classes: int) -> torch.nn.Module:
    """The model at its public initialisation, drawn from its own generator seeded by ``seed`` (torch's
    global RNG is never seeded or advanced, so nothing else can share or reveal the stream)."""
    gen = torch.Generator().manual_seed(public_seed(spec.seed, STREAM_INIT))
    return MODELS[spec.model.kind](spec, n_features, n_classes, gen)


def model_dimension(spec: RunSpec, n_features: int, n_classes: int) -> int:
    """d: the trainable parameters of the spec's model (from its shapes; pretrained models are not sized)."""
    if not MODEL_TRAITS[spec.model.kind].sized_from_shapes:
        raise ValueError(f"optimizer.kind: {spec.optimizer.kind} needs the model's dimension before training; a "
                         f"pretrained model (model.kind {spec.model.kind}) is not supported")
    return sum(p.numel() for p in meta_model(spec, n_features, n_classes).parameters())


def build_estimator(spec: RunSpec, dimension: Optional[int] = None):
    return ESTIMATORS[spec.estimator.kind](spec, dimension)


def build_directions(spec: RunSpec, params) -> Directions:
    """Random directions of the estimator; radius auto = sqrt(d), or d^(1/4) for PAZO-M (§A.1 of PAZO)."""
    est = spec.estimator
    if ESTIMATOR_TRAITS[est.kind].family == NONSMOOTH:  # their directions are per example (PerExampleSphere, PerExampleBall)
        return Directions(params, "sphere", None)
    kind = getattr(est, "directions", "gaussian")
    radius = getattr(est, "radius", "auto")
    if radius == "auto":
        d = sum(p.numel() for p in params)
        radius = d ** 0.25 if est.kind == "pazo_m" else None
    return Directions(params, kind, radius)


def use_direction_cache(spec: RunSpec, params, queries: int) -> bool:
    mode = getattr(spec.estimator, "perturbation", "regenerate")
    if mode != "auto":
        return mode == "cache"
    slots = queries * (2 if spec.execution.prefetch_directions else 1)  # a prefetch holds the next step's too
    slots += 1  # a cached forward runs on a whole perturbed copy (Directions.swapped; a CPU's skips embeddings)
    return slots * sum(p.numel() * p.element_size() for p in params) <= CACHE_LIMIT_BYTES


def planned_event(spec: RunSpec, n_private: Optional[int], sigma: float):
    """The whole planned run's DpEvent at noise multiplier ``sigma``, as the spec's family plans it."""
    return family_for(spec).planned_event(spec, n_private, sigma)


def calibrate_noise(spec: RunSpec, n_private: Optional[int]) -> float:
    """sigma for the whole planned run (dp-accounting's calibration; never less privacy than asked)."""
    return calibrate_sigma(spec, n_private, planned_event)


def resolve_privacy(spec: RunSpec, n_private: Optional[int] = None, dimension: Optional[int] = None):
    """(resolved spec, sampling rate, planned epsilon), as the spec's family plans it. sigma 'auto' is
    calibrated; an explicit sigma must meet the target epsilon; mechanism none resolves to a non-private
    run (epsilon = inf). ``n_private`` is read only where the private count is public (replace-one, or no
    privacy): an add/remove run is planned from its declared row count alone, so planning needs no private
    data. ``dimension``: the model's trainable parameters, which the theory presets need (a synthetic
    source knows its own)."""
    return family_for(spec).resolve(spec, n_private, dimension)


def plan(spec: RunSpec, data: SplitData):
    """resolve_privacy for a spec and its loaded data (the theory families' presets need the model's dimension).
    An estimator whose public batches the public split cannot hold is refused here, before any reservation."""
    if ESTIMATOR_TRAITS[spec.estimator.kind].uses_public and len(data.public):
        problem = too_few_public_rows(getattr(spec.estimator, "public_batches", 1),
                                      getattr(spec.estimator, "public_batch_size", 0), len(data.public))
        if problem:
            raise ValueError(problem)
    family = family_for(spec)
    dimension = model_dimension(spec, data.n_features, data.n_classes) if family.needs_dimension else None
    return family.resolve(spec, len(data.private), dimension)


def planned_before_rows(spec: RunSpec):
    """The planned run's DpEvent from the spec alone, before any row is read: an add/remove run is planned
    from its declared row count, and the theory families' model dimension comes from the rows' shape
    (every block's, which trains nothing and releases nothing)."""
    family = family_for(spec)
    dimension = None
    if family.needs_dimension:
        shapes = load_data(spec, every_block=True)
        dimension = model_dimension(spec, shapes.n_features, shapes.n_classes)
    resolved, _, _ = family.resolve(spec, None, dimension)
    return planned_event(resolved, None, float(resolved.mechanism.noise_multiplier))


def build_optimizer(spec: RunSpec, directions: Directions, model: Optional[torch.nn.Module] = None,
                    n_private: Optional[int] = None):
    return OPTIMIZERS[spec.optimizer.kind](spec, directions, model, n_private)


@dataclass
class LocalParts:
    model: torch.nn.Module
    params: list
    directions: Directions
    estimator: object
    optimizer: object  # Sgd or Adam
    backend: LocalBackend
    device: torch.device


def build_local(spec: RunSpec, data: SplitData, with_private_rows: bool = True) -> LocalParts:
    """One replica: model (public init from the seed), directions, estimator, optimizer and a local backend
    over the private rows (none on a Ray driver, whose workers load their own)."""
    device = device_for(spec)
    model = build_model(spec, data.n_features, data.n_classes).to(device)
    params = models.trainable_parameters(model)
    directions = build_directions(spec, params)
    estimator = build_estimator(spec, directions.dim)
    optimizer = build_optimizer(spec, directions, model, len(data.private))
    rows = data.private if with_private_rows else data.private.__class__(
        data.private.features[:0], data.private.labels[:0], [])
    x = torch.as_tensor(rows.features, device=device)
    y = torch.as_tensor(rows.labels, device=device)
    cache = use_direction_cache(spec, params, len(estimator.direction_seeds(0, spec.seed)))
    persons = None if rows.persons is None else torch.as_tensor(rows.persons, device=device)
    backend = LocalBackend(model, directions, optimizer, x, y, cache_directions=cache,
                           prefetch_directions=spec.execution.prefetch_directions, persons=persons)
    return LocalParts(model, params, directions, estimator, optimizer, backend, device)


def read_split(spec_dict: dict, window_rows: Optional[WindowRows] = None) -> SplitData:
    """The rows a Ray worker or task reads on its own node, split as the driver split them. With data.blocks
    (``window_rows``): the window's rows as the driver chose them from the ledger, read again here (the same
    bounds pushed to a table, the same positions), never the ledger itself. The caller matches their
    ``ordered_digest`` with the driver's before it uses them."""
    spec = RunSpec.model_validate(spec_dict)
    if window_rows is None:
        return load_data(spec)
    return load_data(spec, window_rows.select, within=window_rows.within)


def build_replica(spec_dict: dict, window_rows: Optional[WindowRows] = None) -> tuple:
    """A Ray worker's replica, assembled on its own node: (the ordered digest of the rows it read, a local
    backend over them). The runtime is handed this function, so it never imports the builders."""
    data = read_split(spec_dict, window_rows)
    return data.ordered_digest, build_local(RunSpec.model_validate(spec_dict), data).backend


@dataclass
class Built:
    model: torch.nn.Module
    loop: PrivateLoop
    device: torch.device


def build_loop(spec: RunSpec, data: SplitData, *, noise_generator: Optional[torch.Generator] = None,
               sampling_generator: Optional[torch.Generator] = None, selected_by: Optional[Any] = None) -> Built:
    """Compose the private loop for a resolved spec.

    Private generators come from OS entropy unless injected (tests) or the spec opts into
    ``insecure_deterministic`` (then they derive from ``seed`` through a stream no public use touches).
    ``selected_by``: the loop is one candidate of the search this TuneSpec describes; its tracker says what
    the search spends (the best of K such runs, ``SelectionTracker``).
    """
    if not spec.is_resolved:
        raise ValueError("build_loop needs a resolved spec (no 'auto' left)")
    parts = build_local(spec, data, with_private_rows=spec.execution.backend == "local")
    model, params, directions, estimator, device = parts.model, parts.params, parts.directions, parts.estimator, parts.device
    backend = parts.backend
    if spec.execution.backend == "ray":
        from components.runtime.ray_backend import RayBackend

        ex = spec.execution
        worker_spec = spec.model_dump(mode="json")
        worker_spec["execution"]["device"] = device.type  # never a different "auto" on the workers
        assemble = build_replica if data.window_rows is None else functools.partial(build_replica,
                                                                                   window_rows=data.window_rows)
        backend = RayBackend(parts.backend, worker_spec, assemble, n_private=len(data.private),
                             private_digest=data.ordered_digest, workers=ex.workers,
                             gpus_per_worker=ex.gpus_per_worker, cpus_per_worker=ex.cpus_per_worker,
                             workers_per_node=ex.workers_per_node, address=ex.address,
                             parallelism=ex.parallelism, checksum_every=ex.checksum_every,
                             persons=data.private.persons)
    n_private = len(data.private)
    public = None
    if len(data.public):
        public = PublicOracle(model, params, models.per_example_loss, torch.as_tensor(data.public.features, device=device),
                              torch.as_tensor(data.public.labels, device=device), spec.seed)
    if ESTIMATOR_TRAITS[spec.estimator.kind].uses_public and public is None:
        raise ValueError(f"estimator.kind: {estimator.name} needs public rows and {_no_public_rows(spec)}")

    insecure = spec.privacy is not None and spec.privacy.insecure_deterministic
    # privacy.noise (auto: by estimator kind and step size); an injected generator always wins (tests)
    source = noise_source(spec.privacy.noise if spec.privacy is not None else "fast", spec.estimator.kind,
                          private=spec.mechanism.kind != "none", insecure=insecure,
                          row_parameters=spec_sampler(spec, n_private).expected_batch_size
                          * sum(p.numel() for p in model.parameters()))
    seeded = insecure or noise_generator is not None or sampling_generator is not None
    if noise_generator is None:
        noise_generator = SecureSource() if source == "secure" else private_generator(
            public_seed(spec.seed, STREAM_INSECURE_PRIVATE, 1) if insecure else None)
    if sampling_generator is None:
        sampling_generator = SecureSource() if source == "secure" else private_generator(
            public_seed(spec.seed, STREAM_INSECURE_PRIVATE, 2) if insecure else None)
    sampler = spec_sampler(spec, n_private, sampling_generator, persons=data.private.persons)
    assembly = Assembly(estimator, directions, parts.optimizer, sampler, n_private, noise_generator, seeded,
                        accountant(spec), float(spec.privacy.delta) if spec.privacy is not None else None)
    mechanism, tracker = MECHANISMS[spec.mechanism.kind](spec, assembly)
    if selected_by is not None:
        from components.accountants.accounting import SelectionTracker
        from components.tuning import selection_event

        tracker = SelectionTracker(tracker, functools.partial(selection_event, selected_by))
    loop = PrivateLoop(backend, sampler, estimator, mechanism, tracker, spec.seed, public=public)
    return Built(model, loop, device)


def restart_insecure_streams(spec: RunSpec, built: Built) -> None:
    """insecure_deterministic runs only: the noise and batch streams restart from (seed, step) at each chunk,
    so a run resumed from a checkpoint draws exactly what the uninterrupted run drew. A private run keeps
    its OS-entropy generators (a resumed one gets fresh ones): they are never saved or derived."""
    if spec.privacy is None or not spec.privacy.insecure_deterministic:
        return
    loop = built.loop
    loop.mechanism.use_generator(private_generator(public_seed(spec.seed, STREAM_INSECURE_PRIVATE, 1, loop.step)))
    loop.sampler.use_generator(private_generator(public_seed(spec.seed, STREAM_INSECURE_PRIVATE, 2, loop.step)))


def load_weights(built: Built, state: dict) -> None:
    """Start from another model's weights (a registered version); every key and shape must match."""
    own = built.model.state_dict()
    problems = sorted(set(own) ^ set(state)) + sorted(
        k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if problems:
        raise ValueError(f"optimizer.init: the registered model does not fit this spec's model (differs at "
                         f"{', '.join(problems[:4])}); change the spec or use init: seed")
    built.model.load_state_dict(state)
    built.loop.backend.sync()  # remote replicas start from the loaded weights (in process: nothing to do)


def public_warm_start(spec: RunSpec, built: Built) -> int:
    """Train on the public split before the private phase, if the spec asks for it (no privacy cost)."""
    ws = getattr(spec.estimator, "public_warm_start", None)
    if ws is None:
        return 0
    public = built.loop.public
    if public is None:
        raise ValueError(f"estimator.public_warm_start: needs public rows and {_no_public_rows(spec)}")
    steps = warm_start(built.model, public.params, public.loss, public.features, public.labels,
                       epochs=ws.epochs, lr=ws.lr, batch_size=ws.batch_size, seed=spec.seed)
    built.loop.backend.sync()  # remote replicas start the private phase from the warm-started parameters
    return steps
