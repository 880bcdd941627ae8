"""What ``privzo verify`` reports: one line per check (ok, failed, not applicable, not run) under a headline
that names the first mismatch. The checks themselves are ``flows.record.verify``'s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from flows.ledger import shown_url

OK, FAILED, NOT_APPLICABLE, NOT_RUN = "ok", "failed", "not applicable", "not run"
CHECKS = ("source run", "ledger charge", "epsilon", "model guarantee", "spec and fingerprint", "weights")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | failed | not applicable | not run
    detail: str  # one line: what was compared, or the mismatch


@dataclass
class VerifyReport:
    model_name: str
    version: str
    run_id: Optional[str]
    tracking_uri: str
    ledger_url: Optional[str]
    checks: List[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every check ok, or not applicable to this version (a check that did not run is not a pass)."""
        return all(c.status in (OK, NOT_APPLICABLE) for c in self.checks) and len(self.checks) == len(CHECKS)

    @property
    def complete(self) -> bool:
        """Every check ran and passed: what promotion to ``verified`` asks (not applicable is not checked)."""
        return self.passed and all(c.status == OK for c in self.checks)

    @property
    def first_mismatch(self) -> Optional[str]:
        """The first failed check's line, None if none failed."""
        return next((c.detail for c in self.checks if c.status == FAILED), None)

    def headline(self) -> str:
        where = f"{self.model_name} version {self.version}"
        if self.passed:
            return f"{where}: verified against ledger {shown_url(self.ledger_url)} and run {self.run_id}"
        return f"{where}: FAILED: {self.first_mismatch or 'not every check ran'}"

    def lines(self) -> List[str]:
        """The headline, then one line per check."""
        width = max(len(n) for n in CHECKS)
        return [self.headline()] + [f"  {c.name:<{width}}  {c.status:<14}  {c.detail}" for c in self.checks]

    def __str__(self) -> str:
        return "\n".join(self.lines())
