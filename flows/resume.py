"""Resuming a run: its checkpoint found and checked against the spec, the data, the ledger and the generator
that drew its directions; a reservation left by a run killed before its first private query released; what
a checkpoint is bound to; and the window of blocks a run reads, the same whenever it is resumed."""
from __future__ import annotations

import uuid
from typing import Any, Dict, Optional

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

import specs
from components import builders
from components.data.blocks import open_period
from components.directions import GENERATOR_VERSION
from flows.window import BlockView, Window, as_of_moment
from flows.checkpoints import CheckpointStore, resume_store
from flows.ledger import Budget
from specs.run import spec_digest
from specs.refusal import checks_input

@task(name="find-checkpoint", cache_policy=NO_CACHE)
@checks_input
def find_checkpoint(spec: specs.RunSpec, fingerprint: str, resume: Optional[str], budget: Optional[Budget],
                    legacy: Optional[str] = None):
    """The run's checkpoint store and, when resuming, its last checkpoint (checked against the spec, the
    data and the ledger). The key is ``resume`` or this flow run's id: a retried flow run resumes itself."""
    from prefect.runtime import flow_run

    store = resume_store(spec.checkpoint.dir, spec.name, resume)
    if store is None:  # a new run, or a retried flow run resuming its own checkpoint
        store = CheckpointStore(spec.checkpoint.dir, spec.name, str(flow_run.get_id() or uuid.uuid4().hex))
    if not store.exists():
        store.lock()
        release_orphan(store, budget)
        return store, None
    store.lock()
    try:
        saved = resumable(store, spec, fingerprint, budget, legacy)
    except BaseException:
        store.unlock()
        raise
    get_run_logger().info("resuming %s from its checkpoint at step %d (%s)", spec.name, saved["loop"]["step"],
                          store.path)
    if saved.get("unrecorded_steps"):
        get_run_logger().warning(
            "the killed process may have run up to %d private steps after that checkpoint: all are charged "
            "(%d privacy steps spent)", saved["unrecorded_steps"], saved["loop"]["privacy_steps"])
    return store, saved


def release_orphan(store: CheckpointStore, budget: Optional[Budget]) -> None:
    """A process killed after reserving and before its step-0 checkpoint made no private query: release
    its reservation, which would otherwise count its planned epsilon against the dataset for good. It is on
    the ledger the folder recorded: the run's own, unless the spec named another then."""
    orphan = store.reservation()
    if orphan is None:
        return
    if budget is not None and orphan["ledger"] == budget.url:
        ledger = budget.ledger
    else:
        from flows.ledger import PrivacyLedger

        ledger = PrivacyLedger.open(orphan["ledger"])
    ledger.abort(orphan["charge_id"])  # a reservation only; a committed charge stays
    store.clear_reservation()
    get_run_logger().warning("run %s was killed before its first private query: its ledger reservation %s is "
                             "released, and the run starts from the beginning", store.key, orphan["charge_id"])


def resumable(store: CheckpointStore, spec: specs.RunSpec, fingerprint: str, budget: Optional[Budget],
              legacy: Optional[str] = None) -> Dict[str, Any]:
    """The checkpoint, if this run may continue from it: unfinished, same spec, same private rows (keyed
    fingerprint; ``legacy``, the plain one, matches checkpoints written before they were keyed, and the
    resumed run rewrites them keyed), and its ledger reservation still open."""
    if store.finished:
        raise ValueError(f"resume: run {store.key} of {spec.name} finished; there is nothing to resume")
    saved = store.load()
    written_with = saved.get("directions_version", 1)  # checkpoints before versioning drew version 1
    if written_with != GENERATOR_VERSION:
        raise ValueError(f"resume: checkpoint {store.path} was written by direction generator v{written_with}, this "
                         f"privzo draws v{GENERATOR_VERSION}; its journal would not replay, start a new run")
    if saved["spec_digest"] != spec_digest(spec):
        raise ValueError(f"resume: the spec changed since checkpoint {store.path} was written; resume with the "
                         f"same spec or start a new run")
    if saved["fingerprint"] not in (fingerprint, legacy):
        raise ValueError(f"resume: the private rows changed since checkpoint {store.path} was written; "
                         f"start a new run on the new data")
    if saved["charge_id"] is not None:
        status = budget.ledger.status(saved["charge_id"])
        if status != "reserved":
            raise ValueError(f"resume: ledger charge {saved['charge_id']} is {status}, not reserved; the run "
                             f"was closed, start a new run")
    return saved


def same_stream(store: CheckpointStore, saved: Dict[str, Any], stream: str) -> None:
    """A journal of (seed, coefficient) replays only on the generator that drew its directions, and a
    GPU's streams are not the CPU's. Checkpoints without the field were written by CPU runs."""
    written = saved.get("directions_stream", f"cpu-torch-v{saved.get('directions_version', 1)}")
    if written != stream:
        raise ValueError(f"resume: checkpoint {store.path} drew its directions with {written}, this run would draw "
                         f"{stream}; resume on the kind of device that wrote it (execution.device) or start a new run")


def checkpoint_binding(spec: specs.RunSpec, fingerprint: str, charge_id: Optional[str], run_id: str,
             built: builders.Built, view: Optional[BlockView] = None) -> Dict[str, Any]:
    return {"spec_digest": spec_digest(spec), "fingerprint": fingerprint, "charge_id": charge_id, "run_id": run_id,
            "directions_version": GENERATOR_VERSION, "directions_stream": built.loop.backend.directions.stream,
            **({} if view is None else {"window_as_of": view.window.as_of, "window_blocks": list(view.window.blocks)})}


def run_window(spec: specs.RunSpec, as_of: Optional[str], resume: Optional[str], budget: Budget) -> Window:
    """The blocks a run reads, chosen before any row is read; a resumed run reads the blocks it started with
    (a window with_budget would choose again from a ledger its own reservation has changed)."""
    saved = saved_window(spec, resume)
    moment = as_of_moment(as_of or (saved or {}).get("window_as_of"))
    if saved and saved.get("window_blocks") and not as_of:
        return Window(tuple(saved["window_blocks"]), saved["window_as_of"],
                      open_period(moment, spec.data.blocks.period))
    planned = builders.planned_before_rows(spec) if spec.budget.window.kind == "with_budget" else None
    return Window.for_spec(spec, moment, planned, budget.ledger)


def saved_window(spec: specs.RunSpec, resume: Optional[str]) -> Optional[Dict[str, Any]]:
    """The window a run being resumed read (its checkpoint's moment and blocks), so it reads the same blocks
    whenever it is resumed; None for a new run."""
    from prefect.runtime import flow_run

    store = resume_store(spec.checkpoint.dir, spec.name, resume)
    if store is None and flow_run.get_id():  # a retried flow run resumes its own checkpoint
        store = CheckpointStore(spec.checkpoint.dir, spec.name, str(flow_run.get_id()))
    if store is None or not store.exists():
        return None
    saved = store.load()
    return {k: saved.get(k) for k in ("window_as_of", "window_blocks")} if saved.get("window_as_of") else None
