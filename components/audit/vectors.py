"""The white-box auditor's view of the theory families' releases (docs/design.md, "Algorithm families").

O2NC's oracles (sphere, ball and exact-gradient queries) and the KL paper's full-batch gradients give every
row a d-dimensional clipped vector, and their mechanisms release those vectors' sums in three ways:

* running sums restarted every period (``release_running_sum``): tree aggregation, whose released node b
  is the sum of the increments at positions b - lowbit(b) + 1 .. b plus one fresh noise, and the scheduled
  Gaussians, whose difference of consecutive releases is one increment plus one fresh noise;
* one Gaussian per step (``release_vector``: O2NC's one-shot oracle over a single pass);
* full-batch means (``release_mean``; ``release_norm`` and ``release_choice`` are not scored).

``VectorProbe`` stands between the loop and its backend and mechanism, as ``Probe`` does for the
standard family, and never changes what they compute. For every scored release it observes o (the node,
difference or release itself), computes the expectation E of o given the public facts and each canary
slot's template T_i (its contribution in minus out), all with the backend's own code
(``per_example_vectors``), and adds <T_i, o - E> / var to slot i's score and <T_i, T_k> / var to the
overlap A, var the release's claimed noise variance (a public constant; only the ratios between releases
matter). ``decorrelated_scores`` is then Probe's posterior mean (A + 4 kappa I)^-1 s.

Which rows a batch holds: a sampler that claims no amplification (a single pass's order drawn from the
public seed, or every row) makes it public, so under replace-one neighbours (where a slot's row is there
whatever is included) the probe reads each batch's indices, scores a slot only at the steps that hold it,
and subtracts the exact contributions of the other rows, which the auditor wrote. A subsampled (Poisson)
batch is secret: then every slot is scored at every step against the rate-weighted expectation, as Probe
does, and the queries must draw a row's directions from its content (``keyed_by_row``), never from its
place in a batch it may not be in.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from components.audit.canaries import CanarySet
from components.queries.clipped_sums import per_example_vectors
from components.queries import PerExampleSphere
from components.mechanisms.tree import lowbit
from components.protocols import ScheduledBatches

RUNNING_SUMS = ("tree", "differences")


def _flat(tensors) -> torch.Tensor:
    if isinstance(tensors, torch.Tensor):
        return tensors.detach().double().flatten()
    return torch.cat([torch.as_tensor(t).detach().double().flatten() for t in tensors])


@dataclasses.dataclass
class _Expected:
    """One step's expected increment (or release) and the templates of the slots it may hold."""

    mean: torch.Tensor  # [d]
    slots: np.ndarray  # slot ids
    templates: torch.Tensor  # [len(slots), d]


class VectorProbe:
    """Scores canary slots from one run's d-dimensional releases; see the module docstring.

    ``rows_in`` / ``rows_out`` (known batches): every row of the audit's dataset as the auditor knows it,
    with each slot's row its canary in ``rows_in`` and its alternate in ``rows_out`` (the same filler
    elsewhere), and ``slot_of_row`` its slot (-1 for a filler). Without them (a secret batch), the slots
    are ``canaries`` (in: present, out: absent) and ``background`` the rows always present.
    ``running``: how a running-sum mechanism's releases are taken apart ("tree" nodes or "differences");
    ``release_std(position)``: the claimed std of the node or difference at that position of a period (of
    a ``release_vector``: position 0)."""

    def __init__(self, canaries: CanarySet, loss, device, *, rate: float = 1.0,
                 rows_in: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                 rows_out: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                 slot_of_row: Optional[np.ndarray] = None,
                 background: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                 running: Optional[str] = None, release_std: Optional[Callable[[int], float]] = None):
        if running is not None and running not in RUNNING_SUMS:
            raise ValueError(f"audit: running sums are taken apart as {', '.join(RUNNING_SUMS)}, not {running!r}")
        self.m = len(canaries)
        self.loss = loss
        self.device = device
        self.rate = float(rate)
        self.known = rows_in is not None

        def tensor(a):
            return torch.as_tensor(a, device=device)

        if self.known:
            if rows_out is None or slot_of_row is None:
                raise ValueError("audit: known batches need both versions of every row and each row's slot")
            self._xin, self._yin = tensor(rows_in[0]), tensor(rows_in[1])
            self._xout, self._yout = tensor(rows_out[0]), tensor(rows_out[1])
            self._slot_of_row = np.asarray(slot_of_row, dtype=np.int64)
        else:
            self._x, self._y = tensor(canaries.features), tensor(canaries.labels)
            bx, by = background if background is not None else (canaries.features[:0], canaries.labels[:0])
            self._bx, self._by = tensor(bx), tensor(by)
        self.running = running
        self.release_std = release_std
        self.scores = np.zeros(self.m, dtype=np.float64)
        self.overlap = np.zeros((self.m, self.m), dtype=np.float64)  # sum over releases of <T_i, T_k> / var
        self.releases = 0
        self._residual = 0.0  # summed |o - E|^2 / (var d): the releases' observed spread, in claimed units
        self._at_clip = 0.0
        self._appearances = 0
        self._pending = None
        self._position = 0
        self._period: Dict[int, _Expected] = {}
        self._prefix: Dict[int, torch.Tensor] = {}
        self.backend = None
        self.loop = None

    # ------------------------------------------------------------------ wiring
    def attach(self, loop) -> None:
        """Put the probe between ``loop`` and its backend and mechanism (local backend only)."""
        self.loop = loop
        self.backend = loop.backend
        loop.backend = _Backend(loop.backend, self)
        loop.mechanism = _Mechanism(loop.mechanism, self)

    def expect(self, query, indices: torch.Tensor) -> None:
        """Called with each query: remembered, and turned into templates only if a scored release follows
        (the parameters do not move in between)."""
        if not isinstance(query, PerExampleSphere):
            raise TypeError(f"audit: no d-dimensional canary template for query {type(query).__name__}")
        loop = self.loop
        sampler = loop.sampler
        batch = sampler.batch_at(loop.step) if isinstance(sampler, ScheduledBatches) else sampler.expected_batch_size
        self._pending = (query, indices.detach().cpu().clone() if self.known else None, float(batch))

    def forget(self) -> None:
        self._pending = None

    # ------------------------------------------------------------------ templates
    def _vectors(self, query, x, y, slots=None):
        backend = self.backend
        return per_example_vectors(backend.model, backend.directions, self.loss, x, y, query, slots)

    def _expected(self, scale: float) -> _Expected:
        """The pending query's expectation and templates, each divided by ``scale`` (a batch normaliser or
        the mechanism's row count)."""
        if self._pending is None:
            raise RuntimeError("audit: a release came without its query")
        query, indices, _ = self._pending
        if self.known:
            idx = indices.to(self._xin.device)
            v_in, share = self._vectors(query, self._xin[idx], self._yin[idx])
            slots = self._slot_of_row[indices.numpy()]
            at = np.flatnonzero(slots >= 0)
            if len(at):
                # each slot's alternate at the slot's own place in the batch (its directions depend on it)
                k = torch.as_tensor(at, device=idx.device)
                v_out, _ = self._vectors(query, self._xout[idx[k]], self._yout[idx[k]],
                                         [query.first_slot + int(i) for i in at])
                templates = v_in[k] - v_out
                mean = v_in.sum(dim=0) - 0.5 * templates.sum(dim=0)
                self._at_clip += float(share[k].sum())
                self._appearances += len(at)
            else:
                templates, mean = v_in[:0], v_in.sum(dim=0)
            slot_ids = slots[at]
        else:
            v_in, share = self._vectors(query, self._x, self._y)
            mean = 0.5 * v_in.sum(dim=0)
            if len(self._by):
                mean = mean + self._vectors(query, self._bx, self._by)[0].sum(dim=0)
            templates, mean = v_in, self.rate * mean
            slot_ids = np.arange(self.m)
            self._at_clip += float(share.sum())
            self._appearances += self.m
        return _Expected(mean / scale, slot_ids, templates / scale)

    # ------------------------------------------------------------------ releases
    def _score(self, observed: torch.Tensor, expected: _Expected, variance: float) -> None:
        centred = observed.to(expected.mean.device) - expected.mean
        ids, t = expected.slots, expected.templates
        if len(ids):
            self.scores[ids] += (t @ centred).cpu().numpy() / variance
            self.overlap[np.ix_(ids, ids)] += (t @ t.T).cpu().numpy() / variance
        self._residual += float(centred.pow(2).mean()) / variance
        self.releases += 1

    def observe_vector(self, released) -> None:
        """One Gaussian on the step's sum (O2NC's one-shot oracle)."""
        expected = self._expected(1.0)
        self._pending = None
        self._score(_flat(released), expected, self.release_std(0) ** 2)

    def observe_mean(self, released, std: float, rows: int) -> None:
        """A full-batch mean plus N(0, std^2 I), ``std`` the one the optimizer's plan asked for."""
        expected = self._expected(float(rows))
        self._pending = None
        self._score(_flat(released), expected, float(std) ** 2)

    def observe_running_sum(self, released, period: int) -> None:
        """Position p of a period: its increment's expectation and templates are kept until the period
        ends; the observation is the node released at p (tree) or the difference to p - 1 (scheduled)."""
        _, _, batch = self._pending
        expected = self._expected(batch)
        self._pending = None
        p = self._position + 1
        self._period[p] = expected
        self._prefix[p] = _flat(released)
        low = p - lowbit(p) + 1 if self.running == "tree" else p
        before = self._prefix[low - 1] if low > 1 else torch.zeros_like(self._prefix[p])
        parts = [self._period[q] for q in range(low, p + 1)]
        if len(parts) == 1:
            combined = parts[0]
        else:  # a node's template for a slot: its templates over the node's positions, added
            ids = np.unique(np.concatenate([e.slots for e in parts]))
            where = {int(s): i for i, s in enumerate(ids)}
            templates = torch.zeros(len(ids), parts[0].mean.numel(), dtype=torch.float64,
                                    device=parts[0].mean.device)
            for e in parts:
                for row, s in enumerate(e.slots):
                    templates[where[int(s)]] += e.templates[row]
            combined = _Expected(sum(e.mean for e in parts), ids, templates)
        self._score(self._prefix[p] - before, combined, self.release_std(p) ** 2)
        self._position = p
        if p == period:  # a fresh tree (or sum) next period
            self._position, self._period, self._prefix = 0, {}, {}

    # ------------------------------------------------------------------ results
    @property
    def share_at_clip(self) -> float:
        """Of the canaries' per-example vectors in the scored releases, the share clipped (vector clips), or
        of their coefficients, the share at the clip (scalar clips)."""
        return self._at_clip / self._appearances if self._appearances else 0.0

    def _posterior(self) -> Tuple[np.ndarray, np.ndarray]:
        """Probe's Gaussian model of the scores: s = rate A w + e, w = z - 1/2 ~ N(0, 1/4), e ~ N(0, V A),
        V the releases' observed spread per coordinate (in claimed units). Returns w's posterior mean
        (A' + 4 kappa I)^-1 s (A' = rate A, kappa = V / rate) and its posterior variances, kappa times the
        diagonal of that inverse."""
        variance = self._residual / self.releases if self.releases else 0.0
        if not variance > 0:
            variance = 1.0  # the claimed noise, in the units the releases were scored in
        kappa = variance / self.rate
        a = self.rate * 0.5 * (self.overlap + self.overlap.T)
        inverse = np.linalg.inv(a + 4.0 * kappa * np.eye(self.m))
        return inverse @ self.scores, kappa * np.diag(inverse)

    def decorrelated_scores(self) -> np.ndarray:
        """(A + 4 kappa I)^-1 s (``_posterior``): each slot's posterior mean of z - 1/2."""
        return self._posterior()[0]

    def standardized_scores(self) -> np.ndarray:
        """Each slot's posterior mean over its posterior sd: how many sds its estimate lies from "as likely in
        as out". The slots of one run differ in how much of them the releases show (a single pass's slot in a
        start batch shares its template with the batch's, one in a difference step stands alone; an unread
        row shows nothing), so their posterior means are not equally sure; guesses go to the surest, and
        Phi of this is the model's P(in) the guess count is chosen from (components.audit.guessing)."""
        mean, variance = self._posterior()
        return mean / np.sqrt(np.maximum(variance, 1e-300))


class _Backend:
    """The run's backend, unchanged, telling the probe about each query and its batch."""

    def __init__(self, inner, probe: VectorProbe):
        self._inner = inner
        self._probe = probe

    def query(self, query, indices, clip):
        sums = self._inner.query(query, indices, clip)
        self._probe.expect(query, indices)
        return sums

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Mechanism:
    """The run's mechanism, unchanged, showing the probe each scored release."""

    def __init__(self, inner, probe: VectorProbe):
        self._inner = inner
        self._probe = probe

    def release_vector(self, tensors):
        out = self._inner.release_vector(tensors)
        self._probe.observe_vector(out)
        return out

    def release_running_sum(self, increment: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        out = self._inner.release_running_sum(increment)
        self._probe.observe_running_sum(out, self._inner.period)
        return out

    def release_mean(self, sums, std: float):
        out = self._inner.release_mean(sums, std)
        self._probe.observe_mean(out, std, self._inner.rows)
        return out

    def release_norm(self, sums, std: float) -> float:
        # a norm moves by at most the mean's sensitivity, but not linearly in a slot's inclusion: not
        # scored (leaving a release out only weakens the audit); its query is the mean's that follows
        return self._inner.release_norm(sums, std)

    def release_choice(self, scores, scale: float) -> int:
        self._probe.forget()  # the exponential mechanism's draw is not scored
        return self._inner.release_choice(scores, scale)

    def release_scalars(self, sums):
        raise TypeError("audit: the theory families' probe scores d-dimensional releases, not scalars")

    def __getattr__(self, name):
        return getattr(self._inner, name)
