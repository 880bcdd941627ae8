"""Empirical privacy auditing: canaries through privzo's own loop, membership guesses, and lower bounds on
epsilon at a stated confidence (one-run and many-runs tests)."""
from components.audit.bounds import (
    clopper_pearson,
    many_runs_ceiling,
    many_runs_epsilon,
    one_run_ceiling,
    one_run_epsilon,
    one_run_p_value,
)
from components.audit.run import (
    AuditResult,
    ThreatModelResult,
    audit,
    audit_problem,
    default_canaries,
    with_epsilon,
)
from components.audit.many_runs import audit_many, default_runs, runs_problem

audit_ceiling = one_run_ceiling

__all__ = ["AuditResult", "ThreatModelResult", "audit", "audit_ceiling", "audit_many", "audit_problem",
           "clopper_pearson", "default_canaries", "default_runs", "many_runs_ceiling", "many_runs_epsilon",
           "one_run_ceiling", "one_run_epsilon", "one_run_p_value", "runs_problem", "with_epsilon"]
