"""Turn resolved spec sections into components with plain arguments (the only place that reads specs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from components import models
from components.accountants import Accountant, PrivacyTracker
from components.data import PoissonSampler, SplitData, fraction_split, load_sklearn
from components.estimators import Directions, TwoPointEstimator
from components.mechanisms import GaussianMechanism
from components.optimizers import Sgd
from components.randomness import STREAM_INIT, STREAM_INSECURE_PRIVATE, private_generator, public_seed
from components.runtime import LocalBackend, PrivateLoop
from specs import RunSpec


def load_data(spec: RunSpec) -> SplitData:
    source, split = spec.data.source, spec.data.split
    table = load_sklearn(source.name)
    return fraction_split(table, public=split.public, test=split.test, imbalance=split.imbalance,
                          seed=spec.seed, scale=source.scale)


def build_model(spec: RunSpec, n_features: int, n_classes: int) -> torch.nn.Module:
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(public_seed(spec.seed, STREAM_INIT))  # public init stream; restored below
    try:
        if spec.model.kind == "linear":
            return models.linear(n_features, n_classes)
        return models.mlp(n_features, n_classes, spec.model.hidden, spec.model.activation)
    finally:
        torch.random.set_rng_state(torch_state)


def accountant(spec: RunSpec) -> Accountant:
    return Accountant(spec.privacy.accountant, spec.privacy.neighboring)


def calibrate_noise(spec: RunSpec, n_private: int) -> float:
    """sigma for the whole planned run: Poisson(rate) of Gaussian(sigma), composed over the planned steps."""
    import dp_accounting

    delta = 1.0 / n_private if spec.privacy.delta == "auto" else spec.privacy.delta
    rate = spec.sampling.expected_batch_size / n_private
    steps = spec.planned_steps(n_private)

    def event(sigma: float):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)

    return accountant(spec).calibrate(event, spec.privacy.epsilon, delta)


def device_for(spec: RunSpec) -> torch.device:
    wanted = spec.execution.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("execution.device: cuda requested but no CUDA device is available; use auto or cpu")
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(wanted)


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
    device = device_for(spec)
    model = build_model(spec, data.n_features, data.n_classes).to(device)
    params = models.trainable_parameters(model)
    est = spec.estimator
    directions = Directions(params, est.directions, None if est.radius == "auto" else est.radius)
    estimator = TwoPointEstimator(est.queries, est.smoothing)
    opt = spec.optimizer
    optimizer = Sgd(directions, opt.lr, opt.momentum, opt.weight_decay)
    x = torch.as_tensor(data.private.features, device=device)
    y = torch.as_tensor(data.private.labels, device=device)
    backend = LocalBackend(model, directions, optimizer, x, y, estimator)

    insecure = spec.privacy.insecure_deterministic
    if noise_generator is None:
        noise_generator = private_generator(public_seed(spec.seed, STREAM_INSECURE_PRIVATE, 1) if insecure else None)
    if sampling_generator is None:
        sampling_generator = private_generator(public_seed(spec.seed, STREAM_INSECURE_PRIVATE, 2) if insecure else None)
    sampler = PoissonSampler(len(y), spec.sampling.expected_batch_size, sampling_generator)
    mechanism = GaussianMechanism(spec.mechanism.clip, float(spec.mechanism.noise_multiplier),
                                  estimator.queries_per_step, spec.privacy.neighboring, noise_generator)
    tracker = PrivacyTracker(accountant(spec), sampler.wrap(mechanism.step_event()), float(spec.privacy.delta))
    loop = PrivateLoop(backend, sampler, estimator, mechanism, tracker, spec.seed)
    return Built(model, loop, device)
