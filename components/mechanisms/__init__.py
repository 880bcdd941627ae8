"""Privacy mechanisms: the only door through which private values leave (DESIGN §4 rule 1)."""
from components.mechanisms.gaussian import GaussianMechanism, NoMechanism

__all__ = ["GaussianMechanism", "NoMechanism"]
