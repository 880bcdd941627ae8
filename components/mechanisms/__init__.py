"""Privacy mechanisms: the only door through which private values leave (DESIGN §4 rule 1)."""
from components.mechanisms.gaussian import GaussianMechanism, clip_sum

__all__ = ["GaussianMechanism", "clip_sum"]
