"""The base of everything privzo refuses, on the ground floor so that every layer's refusals derive from it
(a bad spec here, the ledger's and a run's in flows/): flows/refusals.py says what a refusal is, as opposed to
a crash, and how one is reported."""
from __future__ import annotations


class Refusal(Exception):
    """The base of every refusal."""


class RuntimeRefusal(Refusal, RuntimeError):
    """A refusal where callers expect a RuntimeError (the ledger's, a locked run)."""


class ValueRefusal(Refusal, ValueError):
    """A refusal where callers expect a ValueError (a spec that cannot run)."""
