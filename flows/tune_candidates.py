"""What a Ray task of a search runs, and what it calls: a candidate trained in memory, a share of candidates, the
rows a task reads and checks. A module of its own, imported by its package name: a deployment's flow run loads
its entrypoint file (flows/tune.py) by path as a top-level module, under which Ray would pickle these functions
by a name no worker can import (docs/design.md, "What Ray runs")."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

import specs
from components import builders, models
from components.data import SplitData
from components.protocols import Finalizing
from components.tuning import RepeatLaw, better, candidate_spec
from flows.tasks import evaluation


@dataclass
class Candidate:
    """One trained candidate, in memory only: a loser's is dropped with this object."""
    setting: Dict[str, Any]
    spec: specs.RunSpec
    built: Any
    score: float
    curve: List[Tuple[int, Dict[str, float]]] = field(default_factory=list)
    scores: Dict[str, float] = field(default_factory=dict)  # every metric on the score's rows


def scores_of(spec: specs.RunSpec, built, data: SplitData) -> Dict[str, float]:
    """The candidate's metrics on the tune's split (public or test rows: never a private one)."""
    rows = data.public if spec.tune.score.split == "public" else data.test
    if not len(rows):
        raise ValueError(f"tune.score.split: the {spec.tune.score.split} split has no rows to score candidates on; "
                         "give it rows (data.split) or score on the other")
    dev = built.device
    return {k: float(v) for k, v in models.evaluate(built.model, torch.as_tensor(rows.features, device=dev),
                                                    torch.as_tensor(rows.labels, device=dev)).items()}


def train_candidate(search: specs.RunSpec, setting: Dict[str, Any], data: SplitData) -> Candidate:
    """One candidate trained to its end in memory, its curve (the run's evaluation every log_every steps,
    on test and public rows) kept for the winner's child run."""
    spec = candidate_spec(search, setting)
    built = builders.build_loop(spec, data, selected_by=search.tune)  # its tracker: what the search spends
    warm = builders.public_warm_start(spec, built)
    start = evaluation(built, data)
    curve = [(0, {**({"public/warm_start_steps": warm} if warm else {}), **start})]
    steps, every = spec.optimizer.steps, spec.tracking.log_every
    try:
        while built.loop.step < steps and not built.loop.finished:
            built.loop.run(min(steps, built.loop.step + every))
            curve.append((built.loop.step, evaluation(built, data)))
        optimizer = built.loop.backend.optimizer
        if isinstance(optimizer, Finalizing):
            optimizer.finalize()
            curve[-1] = (built.loop.step, evaluation(built, data))
    finally:
        built.loop.backend.close()
    scores = scores_of(search, built, data)
    return Candidate(setting, spec, built, scores[search.tune.score.metric], curve, scores)


def padded_share(search: specs.RunSpec, tasks: int) -> Optional[int]:
    """How many candidates' time a share lasts with tune.pad_to (None without): the K at that quantile of K's
    law, dealt among ``tasks`` shares as the candidates are. A function of the public spec only."""
    q = search.tune.pad_to
    return None if q is None else -(-RepeatLaw(search.tune.candidates).quantile(q) // tasks)


def best_of_share(search: specs.RunSpec, share: List[Dict[str, Any]], data: SplitData,
                  pad_to: Optional[int] = None) -> Optional[Candidate]:
    """The best candidate of ``share``, trained one after another (None when none finished: a candidate that
    raises is a loser; what it raised is not released). With ``pad_to`` (``padded_share``) the share then lasts
    as long as that many candidates, timed by its own (a share without one trains a throwaway candidate, never
    compared nor kept, to time one): its duration says nothing of its size unless the size is past it."""
    best: Optional[Candidate] = None
    began, trained = time.monotonic(), 0
    for setting in share:
        trained += 1
        try:
            candidate = train_candidate(search, setting, data)
        except Exception:  # noqa: BLE001 - a loser; what it raised is not released
            continue
        if best is None or better(search.tune.score.metric, candidate.score, best.score):
            best = candidate
        del candidate  # a loser's model and curve go with it
    if pad_to is not None and trained < pad_to:
        if not trained:
            try:
                train_candidate(search, search.tune.settings()[0], data)
            except Exception:  # noqa: BLE001 - it only times a candidate
                pass
            trained = 1
        spent = time.monotonic() - began
        time.sleep(max(0.0, spent / trained * pad_to - spent))
    return best


def in_process(search: specs.RunSpec) -> specs.RunSpec:
    """The search as one Ray task trains a candidate: its steps in the task's own process."""
    data = search.model_dump(mode="json")
    data["execution"]["backend"] = "local"
    return specs.RunSpec.model_validate(data)


def trained_in_task(job: Tuple[specs.RunSpec, Dict[str, Any]], data: SplitData, threads: int):
    """A rehearsal's setting trained in a Ray task: (its scores, its curve), or None when it raised."""
    search, setting = job
    torch.set_num_threads(threads)
    try:
        candidate = train_candidate(search, setting, data)
    except Exception:  # noqa: BLE001 - a loser; what it raised stays in the task
        return None
    return candidate.scores, candidate.curve


def rows_read(read: Tuple[dict, Any, str], threads: int) -> Tuple[Any, bool]:
    """The rows a Ray task of the private search reads itself from the spec's source (never sent through Ray's
    object store), and whether their ordered digest is the driver's (``read``: the spec, the window's rows, the
    digest)."""
    spec_dict, window_rows, digest = read
    torch.set_num_threads(threads)
    data = builders.read_split(spec_dict, window_rows)
    return data, data.ordered_digest == digest


def rows_match(read: Tuple[dict, Any, str], threads: int) -> bool:
    """A worker's check, run before the search starts: does it read the driver's rows?"""
    return rows_read(read, threads)[1]


def share_in_task(job: Tuple[specs.RunSpec, List[Dict[str, Any]]], read: Tuple[dict, Any, str], threads: int):
    """A Ray task of the private search: its share of the candidates, trained one after another on the rows it
    reads itself (``rows_read``). Returns only the best of its share, (setting, score, curve, its loop's
    state), or None (none finished; a candidate that raised is a loser), and the string "rows changed" when it
    read other rows (it trains none of them)."""
    search, share = job
    data, same = rows_read(read, threads)
    if not same:
        return ROWS_CHANGED
    best = best_of_share(search, share, data, padded_share(search, search.execution.workers))
    return None if best is None else (best.setting, best.score, best.curve, best.built.loop.state_dict())


ROWS_CHANGED = "rows changed"
CHANGED_ROWS = ("data.source: a Ray task of the search read other rows than the driver (the data changed after "
                "the driver read it, or a node holds another copy); every node must read the same rows")
