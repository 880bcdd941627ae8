"""The tasks the flows share: a run's spec loaded and pinned to its worker's ledger, its rows loaded and split,
its plan calibrated, its budget reserved and committed, its model evaluated. The training flow
(private_train.py) and the search (tune.py) both run them; neither takes a step from the other."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders, models
from components.accountants import event_to_json
from components.data import SplitData
from components.protocols import Certifying
from flows.ledger import Budget, DatasetTerms, Reservation, RowsRead, shown_url
from flows.record import reporting
from flows.record.tracking import KEYED_ROWS, keyed_rows, released_fingerprint
from flows.window import BlockView
from flows.worker_config import deployment_run, worker_ledger, worker_ray
from specs.refusal import checks_input, not_refused
from specs.rules import cross_field_problems
from specs.sections import LEDGER_URL_ENV, default_ledger


@dataclass(frozen=True)
class Plan:
    spec: specs.RunSpec  # resolved
    n_private: int
    sampling_rate: float
    planned_epsilon: float
    window: Tuple[str, ...] = ()  # with data.blocks: the blocks the run reads


@task(name="load-and-split", cache_policy=NO_CACHE, retries=2, retry_condition_fn=not_refused)
@checks_input
def load_and_split(spec: specs.RunSpec, view: Optional[BlockView] = None) -> SplitData:
    """``view``: with data.blocks, the run's window; only its rows are loaded into any part."""
    within = None
    if view is not None:
        from components.data.blocks import window_bounds

        within = window_bounds(view.window.blocks, spec.data.blocks.period)
    data = builders.load_data(spec, view.select_some if view is not None else None, within=within)
    if view is not None:
        get_run_logger().info("window of %d blocks as of %s: %s .. %s (the next block, %s, is still arriving)",
                              len(view.window.blocks), view.window.as_of, view.window.blocks[0],
                              view.window.blocks[-1], view.window.next_block)
    if spec.private_count_is_public:
        get_run_logger().info("split %s: %d public, %d private, %d test rows", spec.data.source.name,
                              len(data.public), len(data.private), len(data.test))
    else:  # add/remove: the private count is private; the run uses the declared one
        get_run_logger().info("split %s: %d public, %d test rows; private rows declared as %d", spec.data.source.name,
                              len(data.public), len(data.test), spec.data.declared_private_rows)
    return data


@task(name="calibrate", cache_policy=NO_CACHE)
@checks_input
def calibrate(spec: specs.RunSpec, data: SplitData) -> Plan:
    resolved, rate, eps = builders.plan(spec, data)
    return Plan(resolved, len(data.private), rate, eps)


@task(name="reserve-budget", cache_policy=NO_CACHE, retries=0)
def reserve_budget(plan: Plan, data: SplitData, charge_id: str, budget: Optional[Budget],
                   view: Optional[BlockView] = None, planned=None) -> Optional[str]:
    """Reserve the planned DpEvent on the dataset's lifetime budget, in one transaction, before any
    private row is queried; refuses (writing nothing) if the composed total would exceed it, or if a
    public or test row of this run was private in an earlier one. ``planned``: another event than the spec's
    (a tune rehearsal records a NoOpDpEvent after the same row checks)."""
    spec = plan.spec
    if budget is None:
        return None
    # the ledger is read by more people than the data: it holds keyed fingerprints only
    private, exposed = data.private.fingerprints, data.public.fingerprints + data.test.fingerprints
    keyed_private, keyed_exposed = keyed_rows(private), keyed_rows(exposed)
    return budget.ledger.reserve(Reservation(
        terms=DatasetTerms.of(spec), fingerprint=released_fingerprint(data.private.fingerprint), run_name=spec.name,
        planned=planned if planned is not None else builders.planned_event(
            spec, plan.n_private, float(spec.mechanism.noise_multiplier)),
        steps=spec.optimizer.steps, charge_id=charge_id,
        rows=RowsRead(private=keyed_private, exposed=keyed_exposed, layout=f"{data.layout};{KEYED_ROWS}",
                      legacy_layout=data.layout, legacy_rows=dict(zip(private + exposed, keyed_private + keyed_exposed)),
                      ids_legacy_layout=legacy_ids_layout(data.layout)),
        window=None if view is None else view.read()))


def open_budget(spec: specs.RunSpec) -> Optional[Budget]:
    """A run's budget (``Budget.for_spending``), its identity columns checked, and each dead run's reservation
    that opening it settled named in the run's log: an operator reading the night's flow run sees what an
    earlier night that died was charged."""
    budget = Budget.for_spending(spec)
    if budget is None:
        return None
    identity_unchanged(spec, budget)
    for settled in budget.settled:
        get_run_logger().warning("ledger: %s", settled.line())
    return budget


def identity_unchanged(spec: specs.RunSpec, budget: Budget) -> None:
    """A table's identity columns, as the database's catalogue types them, against the identity the dataset's
    runs recorded: a change is refused before any row is read (flows/ledger/rows.py). A file's is known only
    once read, and is checked in the reservation."""
    if spec.data.source.kind != "sql":
        return
    from components.data.sql import identity_layout_of
    from flows.ledger.rows import refuse_changed_identity

    split = spec.data.split
    layout = identity_layout_of(spec.data.source, blocks=spec.data.blocks,
                                public_flag=split.column if split.kind == "column" else None)
    refuse_changed_identity(budget.dataset, budget.ledger.row_layout(budget.dataset), f"{layout};{KEYED_ROWS}")


def legacy_ids_layout(layout: str) -> Optional[str]:
    """The ledger layout an earlier privzo recorded for this source, if its ids were read another way then."""
    from components.data.table import legacy_identity_layout

    legacy = legacy_identity_layout(layout)
    return None if legacy == layout else f"{legacy};{KEYED_ROWS}"


@task(name="commit-budget", cache_policy=NO_CACHE, retries=3)
def commit_budget(spec: specs.RunSpec, budget: Budget, charge_id: str, event_json: str, steps: int,
                  run_id: Optional[str]) -> float:
    """Charge what was executed (all steps, or those before a crash); returns the dataset's budget left."""
    from components.accountants import event_from_json

    budget.ledger.commit(charge_id, event_from_json(event_json), steps, run_id)
    return spec.budget.lifetime_epsilon - budget.ledger.spent(budget.dataset)


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(built: builders.Built, data: SplitData) -> Dict[str, float]:
    """Metrics on the declared evaluation split and on public data only (never private training rows)."""
    return evaluation(built, data)


def evaluation(built: builders.Built, data: SplitData) -> Dict[str, float]:
    """``evaluate``'s metrics, as a plain function (a sweep cell, itself a task, evaluates with it too)."""
    dev = built.device
    out = {f"eval/{k}": v for k, v in models.evaluate(
        built.model, torch.as_tensor(data.test.features, device=dev), torch.as_tensor(data.test.labels, device=dev)
    ).items()}
    optimizer = built.loop.backend.optimizer
    if isinstance(optimizer, Certifying) and optimizer.certificate() is not None:
        # the synthetic problem's exact Goldstein window certificate (public: F reads no row)
        out["eval/goldstein_certificate"] = optimizer.certificate()
    if len(data.public):
        out["public/loss"] = models.evaluate(
            built.model, torch.as_tensor(data.public.features, device=dev),
            torch.as_tensor(data.public.labels, device=dev))["loss"]
    return out


def load_run_spec(spec_path: Optional[str], spec: Optional[Dict[str, Any]]) -> specs.RunSpec:
    if (spec_path is None) == (spec is None):
        raise ValueError("private_train: give exactly one of spec_path or spec")
    run_spec = specs.load_spec(spec_path) if spec_path is not None else specs.spec_from_dict(spec)
    if run_spec.budget is not None and run_spec.budget.ledger == default_ledger() and os.path.exists("privacy-ledger.db"):
        # earlier privzo kept the default ledger in the working folder: never start a fresh one beside it
        raise ValueError("budget.ledger: ./privacy-ledger.db is a ledger earlier privzo kept here by default; name the "
                         "ledger this dataset's runs use (budget.ledger or PRIVZO_LEDGER_URL, with an absolute path)")
    return run_spec


def charged_to_the_team_ledger(spec: specs.RunSpec) -> specs.RunSpec:
    """On a team's worker (a deployment's flow run) every run is charged to the team's ledger: the one the
    worker's configuration names (flows/worker_config.py, which no job variable moves). A spec naming no ledger
    is given the team's; one naming another, or with no budget, would train on the team's data outside the
    lifetimes its owner registered. A deployment's run never takes a ledger from the environment, which job
    variables set: on a worker no stack configured it is refused, and a personal worker's configuration
    (``"ledger": null``) refuses $PRIVZO_LEDGER_URL rather than trusting it. Where the configuration names the
    stack's Ray, the run's steps run there (``on_the_workers_ray``). Refused in one line before any row is read."""
    if not deployment_run():
        return spec
    return on_the_workers_ray(_on_the_workers_ledger(spec), worker_ray())


def _on_the_workers_ledger(spec: specs.RunSpec) -> specs.RunSpec:
    team = worker_ledger()
    if team is None:
        if os.environ.get(LEDGER_URL_ENV, "").strip():
            raise ValueError(f"budget.ledger: this deployment's run has ${LEDGER_URL_ENV} but its worker's "
                             "configuration names no ledger (a personal worker); a worker's ledger is named by "
                             "that file, never by the environment a job variable sets: unset "
                             f"${LEDGER_URL_ENV}, or name the ledger in the spec")
        return spec
    source = f"this worker's configuration, {shown_url(team)}"
    if spec.budget is not None and "ledger" not in spec.budget.model_fields_set:
        spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"ledger": team})})
    if spec.budget is None:
        raise ValueError(f"budget: a deployment's run on this team's worker is charged to the team's ledger "
                         f"({source}); this spec has no budget section: give budget with the dataset its rows are "
                         "charged to (a run without privacy cannot be charged)")
    if spec.budget.ledger != team:
        raise ValueError(f"budget.ledger: a deployment's run on this team's worker is charged to the team's ledger "
                         f"({source}), not {shown_url(spec.budget.ledger)}; remove budget.ledger")
    return spec


def on_the_workers_ray(spec: specs.RunSpec, address: Optional[str]) -> specs.RunSpec:
    """A deployment's run on a worker whose configuration names its stack's Ray head (``address``) runs its
    steps on that cluster's actors, whatever backend its spec wrote (the operator's choice of where steps
    run changes no privacy term: the same rows, events and charge, the weights to float tolerance), and on no
    other: a spec naming another cluster would send the private rows off the stack, and is refused. Its
    workers and their resources stay the spec's. ``address`` None: the spec as written."""
    if address is None:
        return spec
    execution = spec.execution
    if execution.backend == "ray" and execution.address not in ("local", "auto", address):
        raise ValueError(f"execution.address: a deployment's run on this worker runs its steps on the stack's Ray at "
                         f"{address} (the worker's configuration), never on another cluster, not "
                         f"{execution.address!r}; remove execution.address")
    pinned = spec.model_copy(update={"execution": execution.model_copy(update={"backend": "ray", "address": address})})
    problems = cross_field_problems(pinned)
    if problems:  # what the spec allows locally but not on Ray workers
        raise ValueError(f"{problems[0]} (this worker runs every deployment's steps on its stack's Ray at {address})")
    return pinned


class RunLedger:
    """The privacy ledger as a run session drives it (``flows.session``): reservation and commit go through
    the shared tasks, so each shows as a Prefect task run. ``charged(loop)``: the event and steps a commit
    charges; by default what the loop's tracker executed, a search's its planned event whole. ``planned``: the event
    reserved where it is not the spec's run (a tune rehearsal reserves a NoOpDpEvent)."""

    def __init__(self, plan: Plan, data: SplitData, budget: Optional[Budget], view: Optional[BlockView] = None,
                 charged: Optional[Callable[[Any], Tuple[Any, int]]] = None, planned=None):
        self.plan, self.data, self.budget, self.view = plan, data, budget, view
        self.charged = charged or (lambda loop: (loop.tracker.event(), loop.tracker.steps))
        self.planned = planned  # the event reserved, when not the spec's (a rehearsal's NoOpDpEvent)

    @property
    def url(self) -> str:
        return self.budget.url

    def reserve(self, charge_id: str) -> None:
        reserve_budget(self.plan, self.data, charge_id, self.budget, self.view, planned=self.planned)

    def abort(self, charge_id: str) -> None:
        self.budget.ledger.abort(charge_id)

    def renew(self, charge_id: str, bound=None, planned: bool = False, run_id: Optional[str] = None) -> None:
        """The reservation's lease (``PrivacyLedger.renew``): not a task, a heartbeat renews it in the background."""
        self.budget.ledger.renew(charge_id, bound=bound, planned=planned, run_id=run_id)

    def commit(self, charge_id: str, loop, run_id: Optional[str]) -> float:
        """Charge what ``charged`` says of the run, whatever happened; returns the dataset's budget left."""
        spec = self.plan.spec
        event, steps = self.charged(loop)
        left = commit_budget(spec, self.budget, charge_id, event_to_json(event), steps, run_id)
        fits = self.budget.ledger.next_fit(self.budget.dataset)
        get_run_logger().info("%s", reporting.budget_left_line(spec.budget.dataset, spec.budget.lifetime_epsilon - left,
                                                               spec.budget.lifetime_epsilon, fits))
        return left
