"""One registry per spec section: a validated ``kind`` maps to the builder its own module registered.

A kind's module registers its builder next to its class (``@ESTIMATORS.register("two_point")``), so
``components/builders.py`` is lookups, not if-chains. The registries are closed: a spec names a kind from
its pydantic union, never code (no dotted paths). ``tests/specs/test_traits.py`` checks that every kind in
the JSON schema has exactly one builder here and one row in specs/traits.py. docs/design.md, "Algorithm
families", says what each section's builder takes.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Optional, Tuple, TypeVar

F = TypeVar("F", bound=Callable)


def _home(entry) -> str:
    """The module that registered ``entry``: a function's own, a record's (memory_plan.StepMemory) its term's."""
    return getattr(entry, "term", entry).__module__


class Registry:
    """Builders of one section (``estimator``, ``mechanism``, ...) by kind.

    ``homes``: the packages whose modules register this section's kinds. A lookup first imports every module
    in them (once), so a new kind's module registers itself without a line anywhere else; only privzo's own
    packages are searched, never a name from a spec."""

    def __init__(self, section: str, signature: str, homes: Tuple[str, ...]):
        self.section = section
        self.signature = signature  # what every builder of the section takes and returns (for readers)
        self.homes = homes
        self._builders: Dict[str, Callable] = {}
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for home in self.homes:
            package = importlib.import_module(home)
            for module in pkgutil.walk_packages(package.__path__, prefix=f"{home}."):
                importlib.import_module(module.name)

    def register(self, *kinds: str) -> Callable[[F], F]:
        def add(builder: F) -> F:
            for kind in kinds:
                if kind in self._builders:
                    raise RuntimeError(f"{self.section}.kind {kind!r} has two builders: "
                                       f"{_home(self._builders[kind])} and {_home(builder)}")
                self._builders[kind] = builder
            return builder
        return add

    def __getitem__(self, kind: str) -> Callable:
        self._load()
        try:
            return self._builders[kind]
        except KeyError:
            raise ValueError(f"{self.section}.kind: unknown {kind!r}; allowed: "
                             f"{', '.join(sorted(self._builders))}") from None

    def kinds(self) -> FrozenSet[str]:
        self._load()
        return frozenset(self._builders)


@dataclass
class Assembly:
    """What a mechanism builder reads besides the spec: the run's built parts and its private generators."""

    estimator: Any
    directions: Any
    optimizer: Any
    sampler: Any             # the sampler that draws the batches (its wrap is the accounted amplification)
    n_private: int
    noise_generator: Any     # private randomness (OS entropy unless injected by a test or insecure_deterministic)
    seeded: bool             # the noise is seeded (tests, insecure_deterministic): the report says so
    accountant: Any
    delta: Optional[float]


def mark_seeded(mechanism, parts: Assembly):
    """The privacy report's sentence (randomness.NOISE_SENTENCES) for a seeded noise generator."""
    if parts.seeded:
        mechanism.noise_source = "seeded"
    return mechanism


# the families register the kinds only they use (O2NC's oracles, the tree and scheduled mechanisms, the KL
# optimizers and filtered Gaussians) beside their plans
ESTIMATORS = Registry("estimator", "(spec, dimension) -> estimator", ("components.estimators", "components.families"))
MECHANISMS = Registry("mechanism", "(spec, Assembly) -> (mechanism, tracker)",
                      ("components.mechanisms", "components.families"))
OPTIMIZERS = Registry("optimizer", "(spec, directions, model, n_private) -> optimizer",
                      ("components.optimizers", "components.families"))
# what each estimator kind holds during a step (components.memory_plan.StepMemory), registered beside its class
# with memory_plan.holds; "inference", the forward alone, is the planner's own baseline
STEP_MEMORY = Registry("estimator", "StepMemory: (Sizes, Settings) -> (bytes above the weights, what dominates)",
                       ESTIMATORS.homes)
SAMPLERS = Registry("sampling", "(sampling section, n, generator, rows, seed) -> sampler", ("components.data",))
MODELS = Registry("model", "(spec, n_features, n_classes, generator or None for shapes only) -> module",
                  ("components.models",))
SOURCES = Registry("data.source", "(source section, model tokenizer, public flag column) -> (Table, scale)",
                   ("components.data",))
SPLITS = Registry("data.split", "(spec, table, scale, load) -> SplitData", ("components.data",))

# by the RunSpec field path whose ``kind`` selects the builder, as specs.traits.TABLES
ALL = {"estimator": ESTIMATORS, "mechanism": MECHANISMS, "optimizer": OPTIMIZERS, "sampling": SAMPLERS,
       "model": MODELS, "data.source": SOURCES, "data.split": SPLITS}
