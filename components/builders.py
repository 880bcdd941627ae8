"""Turn resolved spec sections into components with plain arguments (the only place that reads specs)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from components import models
from components.accountants import (Accountant, FilterTracker, OncePerRowTracker, PrivacyTracker, ScheduledTracker,
                                   TreeTracker)
from components.data import (
    build_sampler,
    SplitData,
    column_split,
    fraction_split,
    hashed_split,
    load_file,
    load_images,
    load_sklearn,
    load_text,
    source_split,
)
from components.estimators import (
    Directions,
    DopeSgdEstimator,
    DpgdZerothEstimator,
    FirstOrderEstimator,
    FoSpiderEstimator,
    GepEstimator,
    PazoMEstimator,
    ZoNaiveEstimator,
    ZoSpiderEstimator,
    PazoPEstimator,
    PazoSEstimator,
    PdaDpmdEstimator,
    TwoPointEstimator,
)
from components.estimators.public import PublicOracle, warm_start
from components.mechanisms import GaussianMechanism, NoMechanism, ScheduledGaussian, scheduled_event, tree_event
from components.mechanisms.tree import NoiselessTree, TreeAggregation
from components.optimizers import Adam, O2nc, Sgd
from components.randomness import (
    STREAM_INIT,
    STREAM_INSECURE_PRIVATE,
    SecureSource,
    noise_source,
    private_generator,
    public_seed,
)
from components.runtime import LocalBackend, PrivateLoop
from specs import RunSpec
from specs.run import KL_KINDS, O2NC_KINDS, SPIDER_KINDS


def load_data(spec: RunSpec) -> SplitData:
    split = spec.data.split
    # a file's text column is tokenised by the model's own tokenizer unless the source names one
    model_tokenizer = spec.model.weights if spec.model.kind == "hf" else None
    table, scale = _table(spec.data.source, model_tokenizer, split.column if split.kind == "column" else None)
    if split.kind == "column":
        return column_split(table, test=split.test, seed=spec.seed, scale=scale)
    if split.kind == "source":
        try:
            public_table, _ = _table(split.public_source, model_tokenizer)
        except ValueError as err:  # the loaders name data.source; here it is the public source
            raise ValueError(str(err).replace("data.source.", "data.split.public_source.", 1)) from None
        return source_split(table, public_table, test=split.test, seed=spec.seed, scale=scale,
                            drop_shared=split.shared_rows == "drop_private")
    assign = hashed_split if split.kind == "hashed" else fraction_split
    return assign(table, public=split.public, test=split.test, imbalance=split.imbalance, seed=spec.seed,
                  scale=scale)


def _no_public_rows(spec: RunSpec) -> str:
    split = spec.data.split
    if split.kind == "column":
        return f"no row is flagged public in column {split.column!r}"
    if split.kind == "source":
        return "data.split.public_source gave none"
    return "the split gave none; set data.split.public > 0"


def _table(source, model_tokenizer: Optional[str], public_flag: Optional[str] = None):
    """The source's rows and how to scale them."""
    if source.kind == "synthetic":
        from components.data.sources import Table
        from components.problems import load_w_linear

        if source.problem == "w_linear":
            rows = load_w_linear(source.dimension, source.rows, source.noise_radius, source.data_seed)
        else:  # paper 003's problems
            from components.problems.kl import kl_rows

            rows = kl_rows(source.problem, source.dimension, source.rows, source.data_seed)
        return Table(source.name, rows, np.zeros(len(rows), dtype=np.int64), 1, None,
                     layout=f"synthetic:{source.problem}:{source.dimension}:{source.noise_radius}:{source.data_seed}"), "none"
    if source.kind == "text":
        tokenizer = source.tokenizer or model_tokenizer
        return load_text(source.name, source.max_length, tokenizer), "none"  # ids are not scaled
    if source.kind == "file":
        table = load_file(source.path, file_format=source.format, label=source.label, classes=source.classes,
                          features=source.features, text=source.text,
                          tokenizer=source.tokenizer or model_tokenizer,
                          max_length=source.max_length, public_flag=public_flag, hf_split=source.hf_split)
        return table, "none" if source.text is not None else "public" if source.scale == "auto" else source.scale
    if source.kind == "images":
        return load_images(source.path, classes=source.classes, size=source.size, mode=source.mode), source.scale
    if source.kind == "packaged_images":
        from components.data.packaged import load_packaged_images

        return load_packaged_images(source.name), source.scale
    return load_sklearn(source.name), source.scale


def _meta_model(spec: RunSpec, n_features: int, n_classes: int) -> torch.nn.Module:
    """Shapes only, nothing allocated (module constructors would also draw from the global RNG)."""
    if spec.model.kind == "objective":
        from components.problems import WLinear

        with torch.device("meta"):
            return WLinear(torch.empty(spec.data.source.dimension, dtype=torch.float64))
    with torch.device("meta"):
        if spec.model.kind == "linear":
            return models.linear(n_features, n_classes)
        if spec.model.kind == "cnn":
            source = spec.data.source
            shape = source.image_shape if source.kind in ("images", "packaged_images") else None
            return models.cnn(n_features, n_classes, spec.model.channels, spec.model.activation, shape)
        return models.mlp(n_features, n_classes, spec.model.hidden, spec.model.activation)


def check_model(spec: RunSpec, n_features: int, n_classes: int, memory_bytes: int) -> None:
    """A model that cannot be built for this data, or whose parameters alone exceed ``memory_bytes``,
    fails here in one line instead of deep in training. Pretrained (hf) models are their package's or
    folder's size; only where they are is checked."""
    if spec.model.kind == "hf":
        from components import pretrained

        pretrained.model_path(spec.model.weights)
        if spec.model.lora is not None:
            lora = spec.model.lora
            models.check_adapter_targets(pretrained.encoder_skeleton(spec.model.weights), lora.targets, lora.rank)
        return
    model = _meta_model(spec, n_features, n_classes)
    n = sum(p.numel() for p in model.parameters())
    need = n * 4  # float32
    if need > memory_bytes:
        raise ValueError(f"model: {n:.3g} parameters need {need / 2**30:.3g} GiB, more than this machine's "
                         f"{memory_bytes / 2**30:.3g} GiB of memory; make the model smaller")


def build_model(spec: RunSpec, n_features: int, n_classes: int) -> torch.nn.Module:
    """The model at its public initialisation, drawn from its own generator seeded by ``seed`` (torch's
    global RNG is never seeded or advanced, so nothing else can share or reveal the stream)."""
    gen = torch.Generator().manual_seed(public_seed(spec.seed, STREAM_INIT))
    if spec.model.kind == "hf":
        # pretrained weights come from the package; only the head is drawn, as the other models are
        lora = spec.model.lora
        adapters = None if lora is None else (lora.rank, lora.alpha, tuple(lora.targets))
        return models.text_classifier(spec.model.weights, n_classes, spec.model.trainable, gen, adapters)
    if spec.model.kind == "objective":
        from components.problems import WLinear

        source = spec.data.source
        start = torch.full((source.dimension,), float(source.start), dtype=torch.float64)
        if source.problem != "w_linear":
            from components.kl import synthetic_rows
            from components.problems.kl import KlObjective

            # its exact evaluation reads the simulated rows, a public function of the spec (every row is private)
            return KlObjective(source.problem, start, synthetic_rows(spec))
        return WLinear(start)
    model = _meta_model(spec, n_features, n_classes).to_empty(device="cpu")
    models.initialise_(model, gen)
    return model


def model_dimension(spec: RunSpec, n_features: int, n_classes: int) -> int:
    """d: the trainable parameters of the spec's model (from its shapes; pretrained models are not sized)."""
    if spec.model.kind == "hf":
        raise ValueError("optimizer.kind: o2nc needs the model's dimension before training; a pretrained "
                         "encoder is not supported")
    return sum(p.numel() for p in _meta_model(spec, n_features, n_classes).parameters())


def accountant(spec: RunSpec) -> Accountant:
    if spec.privacy is None:
        return Accountant("rdp", "add_remove")  # non-private runs: only NonPrivateDpEvent (epsilon = inf)
    return Accountant(spec.privacy.accountant, spec.privacy.neighboring)


def build_estimator(spec: RunSpec, dimension: Optional[int] = None):
    est = spec.estimator
    if est.kind in SPIDER_KINDS:
        if spec.mechanism.kind == "tree_aggregation":
            clip, difference_clip = spec.mechanism.clip, spec.mechanism.difference_clip
        else:  # the non-private twin: the preset's clips, which only bound the coefficient of 001's difference
            clip = difference_clip = math.inf
        if spec.mechanism.kind == "scheduled_gaussian":
            clip, difference_clip = spec.mechanism.clip, spec.mechanism.difference_clip
        from components.nonsmooth import spider_period

        keyed = spec.sampling.kind == "poisson"  # add/remove: an added row may shift no other row's directions
        if est.kind == "fo_spider":
            return FoSpiderEstimator(est.radius, dimension, spider_period(spec), est.perturbations, clip,
                                     difference_clip, spec.optimizer.step_bound, est.start_perturbations, keyed)
        return ZoSpiderEstimator(est.variant, est.radius, dimension, spider_period(spec), est.start_directions,
                                 est.directions, clip, difference_clip, spec.optimizer.step_bound, keyed,
                                 est.coupling == "coupled")
    if est.kind == "full_gradient":
        from components.estimators.full_gradient import FullGradientEstimator

        return FullGradientEstimator(adaptive=spec.optimizer.kind == "adaptive_noisy_gd")
    if est.kind == "zo_naive":
        clip = spec.mechanism.clip if spec.mechanism.kind == "gaussian" else math.inf
        return ZoNaiveEstimator(est.radius, dimension, est.directions, clip)
    if est.kind == "two_point":
        return TwoPointEstimator(est.queries, est.smoothing)
    if est.kind == "dpgd_0th":
        return DpgdZerothEstimator(est.queries, est.smoothing)
    if est.kind == "pazo_m":
        return PazoMEstimator(est.queries, est.smoothing, est.mix, est.public_batch_size)
    if est.kind == "pazo_p":
        return PazoPEstimator(est.queries, est.smoothing, est.public_batches, est.public_batch_size, est.basis)
    if est.kind == "pazo_s":
        return PazoSEstimator(est.public_batches, est.public_batch_size, est.candidate_noise, spec.optimizer.lr)
    if est.kind == "first_order":
        return FirstOrderEstimator()
    if est.kind == "gep":
        clip = getattr(spec.mechanism, "clip", None)
        residual_clip = est.residual_clip or clip or 1.0  # without a mechanism nothing is clipped
        return GepEstimator(est.anchors, est.public_batch_size, residual_clip, est.embedding_share)
    if est.kind == "dope_sgd":
        return DopeSgdEstimator(est.public_batch_size)
    if est.kind == "pda_dpmd":
        if not isinstance(spec.optimizer.steps, int):
            raise ValueError("estimator pda_dpmd: its schedule needs the planned steps; resolve the spec first")
        return PdaDpmdEstimator(est.public_batch_size, spec.optimizer.steps)
    raise ValueError(f"estimator.kind: unknown {est.kind!r}")


def build_directions(spec: RunSpec, params) -> Directions:
    """Random directions of the estimator; radius auto = sqrt(d), or d^(1/4) for PAZO-M (§A.1 of PAZO)."""
    est = spec.estimator
    if est.kind in O2NC_KINDS:  # their directions are per example (PerExampleSphere, PerExampleBall)
        return Directions(params, "sphere", None)
    kind = getattr(est, "directions", "gaussian")
    radius = getattr(est, "radius", "auto")
    if radius == "auto":
        d = sum(p.numel() for p in params)
        radius = d ** 0.25 if est.kind == "pazo_m" else None
    return Directions(params, kind, radius)


CACHE_LIMIT_BYTES = 512 * 2**20


def use_direction_cache(spec: RunSpec, params, queries: int) -> bool:
    mode = getattr(spec.estimator, "perturbation", "regenerate")
    if mode != "auto":
        return mode == "cache"
    slots = queries * (2 if spec.execution.prefetch_directions else 1)  # a prefetch holds the next step's too
    slots += 1  # a cached forward runs on a whole perturbed copy (Directions.swapped; a CPU's skips embeddings)
    return slots * sum(p.numel() * p.element_size() for p in params) <= CACHE_LIMIT_BYTES


def spec_sampler(spec: RunSpec, n_private: Optional[int] = None, generator: Optional[torch.Generator] = None):
    """The spec's sampler over ``n_private`` rows, its rate from the public row count (RunSpec.public_rows):
    under add/remove that is the declared count, and ``n_private`` only says which rows exist to draw from
    (planning passes None). Without a generator it can only describe and wrap events, not draw."""
    return build_sampler(spec.sampling, n_private, generator, rows=spec.public_rows(n_private), seed=spec.seed)


def planned_event(spec: RunSpec, n_private: Optional[int], sigma: float):
    """The whole planned run: the sampler's event of Gaussian(sigma), composed over the planned steps. A
    single pass: with a tree, a row's J node releases (the tree's event); with a Gaussian, its one release.
    Paper 003's runs: their plan, or their filter's budget (sigma: the one Gaussian it equals)."""
    import dp_accounting

    if spec.optimizer.kind in KL_KINDS:
        from components import kl

        return kl.planned_event(spec, spec.public_rows(n_private), sigma)
    if spec.sampling.kind == "single_pass":
        if spec.mechanism.kind == "tree_aggregation":
            return tree_event(sigma, spec.sampling.period)
        return dp_accounting.GaussianDpEvent(sigma)
    if spec.mechanism.kind == "scheduled_gaussian":  # restarts and differences, each release on one batch
        mech, steps = spec.mechanism, spec.planned_steps(n_private)
        starts = -(-steps // spec.estimator.period)
        return scheduled_event(sigma, sigma * mech.difference_noise_multiplier / mech.noise_multiplier, starts,
                               steps - starts, spec_sampler(spec, n_private).wrap)
    step = spec_sampler(spec, n_private).wrap(dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(step, spec.planned_steps(n_private))


def calibrate_noise(spec: RunSpec, n_private: Optional[int]) -> float:
    """sigma for the whole planned run (dp-accounting's calibration; never less privacy than asked)."""
    return accountant(spec).calibrate(lambda sigma: planned_event(spec, n_private, sigma), spec.privacy.epsilon,
                                      spec.delta_for(n_private))


def resolve_privacy(spec: RunSpec, n_private: Optional[int] = None, dimension: Optional[int] = None):
    """(resolved spec, sampling rate, planned epsilon). sigma 'auto' is calibrated; an explicit sigma must
    meet the target epsilon; mechanism none resolves to a non-private run (epsilon = inf). ``n_private`` is
    read only where the private count is public (replace-one, or no privacy): an add/remove run is planned
    from its declared row count alone, so planning needs no private data. ``dimension``: the model's
    trainable parameters, which O2NC's presets need (a synthetic source knows its own)."""
    if spec.optimizer.kind == "o2nc":
        from components.nonsmooth import resolve_o2nc

        return resolve_o2nc(spec, n_private, dimension)
    if spec.optimizer.kind in KL_KINDS:
        from components.kl import resolve_kl

        return resolve_kl(spec, n_private, dimension)
    rate = spec_sampler(spec, n_private).rate  # also checks the batch size against the rows
    if spec.mechanism.kind == "none":
        return spec.resolved(n_private=n_private, noise_multiplier=None), rate, math.inf
    sigma = spec.mechanism.noise_multiplier
    sigma = calibrate_noise(spec, n_private) if sigma == "auto" else float(sigma)
    resolved = spec.resolved(n_private=n_private, noise_multiplier=sigma)
    eps = accountant(resolved).epsilon(planned_event(resolved, n_private, sigma), float(resolved.privacy.delta))
    if eps > resolved.privacy.epsilon * (1 + 1e-9):
        raise ValueError(f"mechanism.noise_multiplier: {sigma} gives epsilon {eps:.4g} > privacy.epsilon "
                         f"{resolved.privacy.epsilon}; use noise_multiplier: auto or raise it")
    return resolved, rate, eps


def plan(spec: RunSpec, data: SplitData):
    """resolve_privacy for a spec and its loaded data (O2NC's presets need the model's dimension)."""
    planned = spec.optimizer.kind == "o2nc" or spec.optimizer.kind in KL_KINDS
    dimension = model_dimension(spec, data.n_features, data.n_classes) if planned else None
    return resolve_privacy(spec, len(data.private), dimension)


def device_for(spec: RunSpec) -> torch.device:
    """Where the model and its directions live. With Ray, ``auto`` takes a GPU only when the workers get
    GPUs too: the driver's replica and the workers' must draw directions on the same kind of device (a
    GPU's streams are not the CPU's), and the workers are sent the driver's choice."""
    ex = spec.execution
    wanted = ex.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("execution.device: cuda requested but no CUDA device is available; use auto or cpu")
    if wanted == "auto":
        gpus = torch.cuda.is_available() and (ex.backend == "local" or ex.gpus_per_worker > 0)
        return torch.device("cuda" if gpus else "cpu")
    return torch.device(wanted)


def build_optimizer(spec: RunSpec, directions: Directions, model: Optional[torch.nn.Module] = None,
                    n_private: Optional[int] = None):
    opt = spec.optimizer
    if opt.kind in KL_KINDS:
        from components import kl
        from components.optimizers.kl import AdaptiveNoisyGd, KlSpider, ProximalPoint

        plan = kl.plan_for(spec, spec.public_rows(n_private), directions.dim, float(spec.mechanism.noise_multiplier))
        if opt.kind == "kl_spider":
            return KlSpider(directions, plan)
        if opt.kind == "proximal_point":
            return ProximalPoint(directions, plan)
        return AdaptiveNoisyGd(directions, plan, opt.select)
    if opt.kind == "o2nc":
        oracle = None
        if getattr(model, "objective", None) == "w_linear":
            from components.problems import smoothed_gradient

            radius = spec.estimator.radius
            oracle = lambda z: smoothed_gradient(z, radius)  # noqa: E731 (exact, public: F = h reads no row)
        return O2nc(directions, opt.step_bound, opt.lr, opt.window, opt.steps, spec.seed,
                    restart_every=opt.window if opt.restart else None, smoothed_gradient=oracle)
    if opt.kind == "adam":
        return Adam(directions, opt.lr, opt.betas, opt.eps, opt.weight_decay)
    return Sgd(directions, opt.lr, opt.momentum, opt.weight_decay)


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
    backend = LocalBackend(model, directions, optimizer, x, y, cache_directions=cache,
                           prefetch_directions=spec.execution.prefetch_directions)
    return LocalParts(model, params, directions, estimator, optimizer, backend, device)


def build_replica(spec_dict: dict) -> tuple:
    """A Ray worker's replica, assembled on its own node: (the ordered digest of the rows it loaded, a local
    backend over them). The runtime is handed this function, so it never imports the builders."""
    spec = RunSpec.model_validate(spec_dict)
    data = load_data(spec)
    return data.ordered_digest, build_local(spec, data).backend


@dataclass
class Built:
    model: torch.nn.Module
    loop: PrivateLoop
    device: torch.device


def build_loop(spec: RunSpec, data: SplitData, *, noise_generator: Optional[torch.Generator] = None,
               sampling_generator: Optional[torch.Generator] = None) -> Built:
    """Compose the private loop for a resolved spec.

    Private generators come from OS entropy unless injected (tests) or the spec opts into
    ``insecure_deterministic`` (then they derive from ``seed`` through a stream no public use touches).
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
        backend = RayBackend(parts.backend, worker_spec, build_replica, n_private=len(data.private),
                             private_digest=data.ordered_digest, workers=ex.workers,
                             gpus_per_worker=ex.gpus_per_worker, cpus_per_worker=ex.cpus_per_worker,
                             workers_per_node=ex.workers_per_node, address=ex.address,
                             parallelism=ex.parallelism, checksum_every=ex.checksum_every)
    n_private = len(data.private)
    public = None
    if len(data.public):
        public = PublicOracle(model, params, models.per_example_loss, torch.as_tensor(data.public.features, device=device),
                              torch.as_tensor(data.public.labels, device=device), spec.seed)
    if estimator.uses_public and public is None:
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
    sampler = spec_sampler(spec, n_private, sampling_generator)
    tree = spec.estimator.kind in SPIDER_KINDS
    if spec.optimizer.kind in KL_KINDS:  # a privacy filter over the plan (paper 003)
        from components import kl
        from components.mechanisms.full_batch import FullBatchGaussian

        plan = parts.optimizer.plan
        mechanism = FullBatchGaussian(float(spec.mechanism.clip), spec.public_rows(n_private),
                                      float(spec.mechanism.noise_multiplier), noise_generator)
        if seeded:
            mechanism.noise_source = "seeded"
        budget = plan.budget + plan.selection_rho if isinstance(plan, kl.AdaptivePlan) else kl.rho_of(
            float(spec.mechanism.noise_multiplier))
        tracker = FilterTracker(accountant(spec), kl.charged_event(spec, float(spec.mechanism.noise_multiplier)),
                                budget, float(spec.privacy.delta),
                                threshold=plan.threshold if isinstance(plan, kl.AdaptivePlan) else None,
                                step_cost_bound=kl.step_cost_bound(plan))
    elif spec.mechanism.kind == "none":
        # a spider oracle's twin: the running sums restarted every period, with no noise and no clip
        mechanism = NoiselessTree(estimator.period) if tree else NoMechanism(estimator.queries_per_step)
        tracker = PrivacyTracker(accountant(spec), mechanism.step_event(), 0.0)
    elif spec.mechanism.kind == "scheduled_gaussian":
        from components.nonsmooth import neighbour_factor, scheduled_sensitivities

        mech = spec.mechanism
        mechanism = ScheduledGaussian(estimator.period, (float(mech.noise_multiplier), float(mech.difference_noise_multiplier)),
                                      scheduled_sensitivities(spec, n_private), noise_generator, neighbour_factor(spec))
        if seeded:
            mechanism.noise_source = "seeded"
        tracker = ScheduledTracker(accountant(spec), mechanism.multipliers, estimator.period, float(spec.privacy.delta),
                                   sampler.wrap)
        tracker.is_start = lambda: mechanism.at_boundary
    elif tree:
        from components.nonsmooth import node_sensitivity

        z = float(spec.mechanism.noise_multiplier)
        mechanism = TreeAggregation(spec.sampling.period, z, node_sensitivity(spec, directions.dim), noise_generator)
        if seeded:
            mechanism.noise_source = "seeded"
        tracker = TreeTracker(accountant(spec), z, spec.sampling.period, float(spec.privacy.delta))
    elif spec.sampling.kind == "single_pass":  # zo_naive: each row in one Gaussian release
        mechanism = GaussianMechanism(spec.mechanism.clip * math.sqrt(directions.dim),
                                      float(spec.mechanism.noise_multiplier), 1, spec.privacy.neighboring,
                                      noise_generator)
        if seeded:
            mechanism.noise_source = "seeded"
        tracker = OncePerRowTracker(accountant(spec), mechanism.step_event(), float(spec.privacy.delta))
    else:
        mechanism = GaussianMechanism(spec.mechanism.clip, float(spec.mechanism.noise_multiplier),
                                      estimator.queries_per_step, spec.privacy.neighboring, noise_generator)
        if seeded:
            mechanism.noise_source = "seeded"  # the privacy report's sentence: randomness.NOISE_SENTENCES
        tracker = PrivacyTracker(accountant(spec), sampler.wrap(mechanism.step_event()), float(spec.privacy.delta))
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
    sync = getattr(built.loop.backend, "sync", None)
    if sync is not None:
        sync()


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
    sync = getattr(built.loop.backend, "sync", None)
    if sync is not None:
        sync()  # remote replicas start the private phase from the warm-started parameters
    return steps
