"""Privacy mechanisms: the only door through which private values leave (docs/design.md, "Privacy invariants" 1).
Each is a components.protocols.Mechanism whose ``release*`` methods are its releases: QueryReleases (gaussian,
none), RunningSumReleases (tree aggregation, scheduled Gaussians, the noiseless tree) or FullBatchReleases."""
from components.mechanisms.gaussian import GaussianMechanism, NoMechanism
from components.mechanisms.scheduled import ScheduledGaussian, scheduled_event
from components.mechanisms.tree import TreeAggregation, tree_event

__all__ = ["GaussianMechanism", "NoMechanism", "ScheduledGaussian", "TreeAggregation", "scheduled_event", "tree_event"]
