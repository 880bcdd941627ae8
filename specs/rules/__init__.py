"""Cross-field rules, one module per algorithm family (standard, nonsmooth, kl) and one for what they share.

Every rule reads kinds' facts from specs/traits.py; each message names its fields and the fix. The rules
take a RunSpec but never import it (specs/run.py calls them from its validator)."""
from specs.rules.common import cross_field_problems
from specs.rules.kl import KL_ASSUMPTIONS, kl_problems
from specs.rules.nonsmooth import nonsmooth_problems
from specs.rules.standard import standard_problems

__all__ = ["KL_ASSUMPTIONS", "cross_field_problems", "kl_problems", "nonsmooth_problems", "standard_problems"]
