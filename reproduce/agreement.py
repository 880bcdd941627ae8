"""The one rule every reproduction's kernel is held to: it must give privzo's own loop's trajectory."""
from __future__ import annotations

from typing import ClassVar, Tuple

TOLERANCE = 1e-9  # the largest |privzo - kernel| over any compared coordinate


class Agreement:
    """For a dataclass comparing privzo with a kernel: ``compared`` names its fields holding a max |difference|."""

    compared: ClassVar[Tuple[str, ...]]

    @property
    def difference(self) -> float:
        return max(getattr(self, name) for name in self.compared)

    @property
    def ok(self) -> bool:
        return self.difference <= TOLERANCE
