"""Privacy mechanisms: the only door through which private values leave (DESIGN §4 rule 1)."""
from components.mechanisms.gaussian import GaussianMechanism, NoMechanism
from components.mechanisms.scheduled import ScheduledGaussian, scheduled_event
from components.mechanisms.tree import TreeAggregation, tree_event

__all__ = ["GaussianMechanism", "NoMechanism", "ScheduledGaussian", "TreeAggregation", "scheduled_event", "tree_event"]
