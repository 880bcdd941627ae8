"""Canaries and the white-box auditor's view of a run.

A canary is a row the auditor writes. Each one is a random direction in feature space with a random label,
scaled so far out that its per-example value (a finite difference, a gradient, a loss) is far past the
clip: what reaches a release is then exactly its clipped value, +-C or a vector of norm C, the worst case
the sensitivity allows. Canaries are drawn from the audit's public seed, before the run and independently
of which of them are included.

``Probe`` stands between privzo's loop and its backend and mechanism. It never changes what they compute.
For every query the estimator makes it evaluates, on every canary (included or not), the clipped value the
canary would add to the release, and when the mechanism releases the noisy sum it scores each canary by how
well the release matches that value. Everything it uses is public in the white-box threat model: the
parameters x_t (a function of earlier releases and the public initialisation), the query (public seeds,
public gradients and earlier releases), the canaries themselves, the sampling rate, and the release. It
never looks at which rows a batch held. So the scores, and the guesses made from them, are a
post-processing of what the run publishes, as the one-run theorem requires.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from components.queries.clipped_sums import gram, per_example_gradient_matrix, per_example_values
from components.queries import (
    EmbeddedGradients,
    FiniteDifferences,
    LossValues,
    PerExampleGradients,
    VectorFiniteDifferences,
)

# dense per-canary templates (m x d floats) above this are refused: fewer canaries, or a smaller model
TEMPLATE_LIMIT_BYTES = 1 << 30


@dataclass(frozen=True)
class CanarySet:
    """m canary slots. ``features``/``labels``: the row a slot holds when its canary is in. Under replace-one
    neighbours a slot always holds a row, ``features``/``labels`` when in and ``alternate_*`` when out."""

    features: np.ndarray  # [m, F] float32
    labels: np.ndarray  # [m] int64
    alternate_features: Optional[np.ndarray] = None
    alternate_labels: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def replace_one(self) -> bool:
        return self.alternate_features is not None


def draw_canaries(m: int, n_features: int, n_classes: int, seed: int, *, replace_one: bool = False) -> CanarySet:
    """m random unit directions in feature space with uniform labels (scale 1; see ``scale_canaries``)."""
    rng = np.random.default_rng(seed)

    def rows():
        x = rng.standard_normal((m, n_features))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x.astype(np.float32), rng.integers(0, n_classes, size=m).astype(np.int64)

    x, y = rows()
    if not replace_one:
        return CanarySet(x, y)
    xa, ya = rows()
    return CanarySet(x, y, xa, ya)


def scaled(canaries: CanarySet, scale: float) -> CanarySet:
    alt = None if canaries.alternate_features is None else canaries.alternate_features * np.float32(scale)
    return CanarySet(canaries.features * np.float32(scale), canaries.labels, alt, canaries.alternate_labels)


def pick(canaries: CanarySet, index: int) -> CanarySet:
    """The one slot ``index`` as a set of one."""
    at = slice(index, index + 1)
    alt = None if canaries.alternate_features is None else canaries.alternate_features[at]
    alt_y = None if canaries.alternate_labels is None else canaries.alternate_labels[at]
    return CanarySet(canaries.features[at], canaries.labels[at], alt, alt_y)


def opposite_alternates(model, params, loss, canaries: CanarySet, device) -> CanarySet:
    """Under replace-one a slot's template is its canary's contribution minus its alternate's, at most twice
    the clip when the two point opposite ways. Per slot, the alternate kept is the drawn one or the mirrored
    canary (-x, same label), whichever loss gradient at the current (public) parameters points further from
    the canary's: a public choice made before the run. (Mirroring is no use where a row's loss is even in
    it, as a squared residual of a row holding its own target is.)"""
    if not canaries.replace_one:
        raise ValueError("canaries: only replace-one slots have alternates")

    def gradients(x, y):
        return per_example_gradient_matrix(model, params, loss, torch.as_tensor(x, device=device),
                                           torch.as_tensor(y, device=device)).double()

    def cosine(a, b):
        den = torch.linalg.vector_norm(a, dim=1) * torch.linalg.vector_norm(b, dim=1)
        return torch.nan_to_num((a * b).sum(dim=1) / torch.clamp(den, min=1e-300), nan=1.0)

    own = gradients(canaries.features, canaries.labels)
    mirrored = -canaries.features
    mirror = (cosine(own, gradients(mirrored, canaries.labels))
              < cosine(own, gradients(canaries.alternate_features, canaries.alternate_labels))).cpu().numpy()
    return CanarySet(canaries.features, canaries.labels,
                     np.where(mirror[:, None], mirrored, canaries.alternate_features).astype(np.float32),
                     np.where(mirror, canaries.labels, canaries.alternate_labels).astype(np.int64))


def gradient_norms(model, params, loss, features: np.ndarray, labels: np.ndarray, device) -> np.ndarray:
    x = torch.as_tensor(features, device=device)
    y = torch.as_tensor(labels, device=device)
    g = per_example_gradient_matrix(model, params, loss, x, y)
    return torch.linalg.vector_norm(g.double(), dim=1).cpu().numpy()


def scale_for_clip(model, params, loss, canaries: CanarySet, target_norm: float, device, *,
                   max_scale: float = 1e4) -> float:
    """The feature scale at which the canaries' median loss-gradient norm at the current (public)
    parameters reaches ``target_norm``. A ReLU network's gradient grows about linearly with the scale of
    its input once the logits saturate, so a few multiplicative corrections get there."""
    scale = 1.0
    for _ in range(8):
        norms = gradient_norms(model, params, loss, canaries.features * np.float32(scale), canaries.labels, device)
        median = float(np.median(norms[np.isfinite(norms)])) if np.isfinite(norms).any() else 0.0
        if median >= target_norm:
            break
        factor = 16.0 if median <= 0 else min(16.0, max(1.5, 1.2 * target_norm / median))
        scale = min(max_scale, scale * factor)
        if scale >= max_scale:
            break
    return scale


def _clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    # min(1, C / norm); a non-finite norm contributes nothing, as in the backend's own clipping
    finite = torch.isfinite(norms)
    return torch.where(finite, torch.clamp(clip / torch.clamp(norms, min=1e-300), max=1.0), torch.zeros_like(norms))


class Probe:
    """Scores canaries from the releases of one run (white-box), see the module docstring.

    For release t let T_i(t) be slot i's clipped contribution when in, minus its contribution when out
    (nothing, under add/remove), and let the expected release be the sampling rate times the background's
    contributions plus half of each slot's two (each canary is in with probability 1/2). The matched
    score s_i adds <T_i(t), release(t) - expected(t)> over every release. Canaries overlap: the released
    sums hold every sampled canary, and when T_i and T_k point the same way for many steps, canary k's
    inclusion moves s_i too. The overlap is known to the auditor, E[s | z] = A (z - 1/2) with
    A_ik = rate * sum_t <T_i(t), T_k(t)>, so ``decorrelated_scores`` undoes it: the posterior mean of
    z - 1/2 under a Gaussian model, (A + 4 kappa I)^-1 s, kappa the observed variance of a release
    coordinate around its expectation over the rate."""

    def __init__(self, canaries: CanarySet, background_x: torch.Tensor, background_y: torch.Tensor, rate: float,
                 loss, device, noise_std: float = 0.0, dense_overlap_every: int = 1, copies: int = 1):
        self.canaries = canaries
        # a canary person's rows are ``copies`` of its row: their sum, clipped, is what the person adds
        self.copies = int(copies)
        self._now = 1  # what the template functions scale a row by: copies for a canary, 1 for the background
        self.m = len(canaries)
        self._x = torch.as_tensor(canaries.features, device=device)
        self._y = torch.as_tensor(canaries.labels, device=device)
        self._xa = None if canaries.alternate_features is None else torch.as_tensor(canaries.alternate_features,
                                                                                    device=device)
        self._ya = None if canaries.alternate_labels is None else torch.as_tensor(canaries.alternate_labels,
                                                                                  device=device)
        self._bx, self._by = background_x, background_y
        self.rate = float(rate)
        self.loss = loss
        self.noise_std = float(noise_std)  # the claimed noise per coordinate (a public constant of the run)
        self.scores = np.zeros(self.m, dtype=np.float64)
        self.overlap = np.zeros((self.m, self.m), dtype=np.float64)  # sum_t <T_i(t), T_k(t)>
        self.releases = 0
        self.at_clip = 0.0  # share of canary values at the clip, summed over releases (mean: / releases)
        self._spread = 0.0  # summed per-coordinate variance the sampling adds to the releases (a model)
        self._residual = 0.0  # summed observed mean square of release - expected release, per coordinate
        self._dense_every = max(1, int(dense_overlap_every))
        self._dense_seen = 0
        self._pending = None
        self.backend = None

    # ------------------------------------------------------------------ wiring
    def attach(self, loop) -> None:
        """Put the probe between ``loop`` and its backend and mechanism (local backend only)."""
        self.backend = loop.backend
        loop.backend = _ProbedBackend(loop.backend, self)
        loop.mechanism = _ProbedMechanism(loop.mechanism, self)

    # ------------------------------------------------------------------ templates
    def _rows(self):
        yield self._x, self._y
        if self._xa is not None:
            yield self._xa, self._ya

    def expect(self, query, clip: float) -> None:
        """Called with each query, before its release: every canary's clipped contribution at x_t.
        Each ``values`` below returns (contributions [rows, k], their squared norms [rows], float64)."""
        backend = self.backend
        model, directions = backend.model, backend.directions
        if isinstance(query, (FiniteDifferences, LossValues)):
            def values(x, y):
                v = per_example_values(model, directions, self.loss, x, y, query) * self._now  # [size, rows]
                v = torch.nan_to_num(v, nan=0.0).clamp(-clip, clip).T.contiguous()  # [rows, size]
                return v, v.double().pow(2).sum(dim=1)
            self._pending = ("scalar", self._templates(values, clip, per_entry=True), None)
        elif isinstance(query, VectorFiniteDifferences):
            g = gram(directions, query)

            def inner(w):  # |sum_j w_ij u_j|^2 for each row
                return torch.clamp(torch.einsum("bj,jk,bk->b", w, g, w), min=0.0)

            def values(x, y):
                v = per_example_values(model, directions, self.loss, x, y, query)  # [q, rows]
                a = v.double().T * (self._now / v.shape[0])
                a = torch.where(torch.isfinite(a).all(dim=1, keepdim=True), a, torch.zeros((), dtype=a.dtype))
                w = a * _clip_factors(torch.sqrt(inner(a)), clip)[:, None]  # coefficients on the q directions
                return w, inner(w)
            self._pending = ("vector", self._templates(values, clip), (query, g))
        elif isinstance(query, PerExampleGradients):
            params = directions.params
            d = sum(p.numel() for p in params)
            self._check_dense(d, params[0].element_size())

            def values(x, y):
                # in the parameters' precision, in place: m x d of them a step, the audit's one large cost
                if len(y) == 0:
                    return (torch.zeros(0, d, dtype=params[0].dtype, device=x.device),
                            torch.zeros(0, dtype=torch.float64, device=x.device))
                gr = per_example_gradient_matrix(model, params, self.loss, x, y)
                if query.center is not None:  # DOPE-SGD clips around a public center
                    gr.sub_(torch.cat([c.detach().flatten() for c in query.center]).to(gr)[None, :])
                if self._now != 1:
                    gr.mul_(self._now)
                norms = torch.linalg.vector_norm(gr, dim=1).double()
                factors = _clip_factors(norms, clip)
                finite = torch.isfinite(norms)
                if not bool(finite.all()):
                    gr[~finite] = 0.0
                    norms = torch.where(finite, norms, torch.zeros((), dtype=norms.dtype))
                return gr.mul_(factors.to(gr.dtype)[:, None]), (norms * factors).pow(2)
            self._pending = ("dense", self._templates(values, clip), None)
        elif isinstance(query, EmbeddedGradients):
            params = directions.params
            self._check_dense(sum(p.numel() for p in params), params[0].element_size())
            k = query.basis.shape[0]

            def values(x, y):
                basis = query.basis.to(params[0].dtype)
                if len(y) == 0:
                    return (torch.zeros(0, basis.shape[0] + basis.shape[1], dtype=basis.dtype, device=x.device),
                            torch.zeros(0, dtype=torch.float64, device=x.device))
                gr = per_example_gradient_matrix(model, params, self.loss, x, y)
                w = gr @ basis.T
                r = gr - w @ basis
                wn = torch.linalg.vector_norm(w, dim=1).double()
                wf = _clip_factors(wn, clip)
                rf = _clip_factors(torch.linalg.vector_norm(r, dim=1).double(), query.residual_clip)
                keep = ((wf > 0) & (rf > 0))[:, None]
                w = torch.where(keep, w * wf.to(w.dtype)[:, None], torch.zeros((), dtype=w.dtype))
                r = torch.where(keep, r * rf.to(r.dtype)[:, None], torch.zeros((), dtype=r.dtype))
                # the embedding's clip is the one C bounds: its norm says whether a canary is at the clip
                return torch.cat([w, r], dim=1), torch.where(keep[:, 0], wn * wf, torch.zeros_like(wn)).pow(2)
            templates = self._templates(values, clip)
            # the two parts' noise differs (mechanism.release_embedded): weight each by 1 / its variance
            weights = torch.cat([
                torch.full((k,), query.embedding_share, dtype=templates[0].dtype),
                torch.full((templates[0].shape[1] - k,),
                           (1.0 - query.embedding_share) * (clip / query.residual_clip) ** 2,
                           dtype=templates[0].dtype)]).to(templates[0].device)
            self._pending = ("embedded", templates, weights)
        else:
            raise TypeError(f"audit: no canary template for query {type(query).__name__}")

    def _check_dense(self, d: int, element_size: int) -> None:
        if self.m * d * element_size * (2 if self._xa is not None else 1) > TEMPLATE_LIMIT_BYTES:
            raise ValueError(f"canaries: {self.m} canaries x {d} parameters of dense templates need more than "
                             f"{TEMPLATE_LIMIT_BYTES / 2**30:.0f} GiB; use fewer canaries (--canaries)")

    def _templates(self, values, clip: float, per_entry: bool = False):
        """(template [m, k], expected release [k], share of canary values at the clip, spread): spread is
        the per-coordinate variance the sampling adds to the release, rate * (background + half of the
        slots) squared contributions over k (a model for the decorrelation, nothing more). At the clip:
        each scalar entry at +-C, or each vector of norm C."""
        self._now = self.copies
        parts = [values(x, y) for x, y in self._rows()]
        self._now = 1
        first, first_sq = parts[0]
        template = first if len(parts) == 1 else first - parts[1][0]
        mean = sum(v.sum(dim=0).double() for v, _ in parts) * 0.5
        energy = 0.5 * sum(float(sq.sum()) for _, sq in parts)
        if len(self._by):
            bg, bg_sq = values(self._bx, self._by)
            mean = mean + bg.sum(dim=0).double()
            energy += float(bg_sq.sum())
        mean = mean * self.rate
        spread = self.rate * energy / max(1, template.shape[1])
        if per_entry:
            share = float((first.abs() >= clip * (1 - 1e-4)).double().mean()) if first.numel() else 0.0
        else:
            share = float((first_sq >= (clip * (1 - 1e-4)) ** 2).double().mean()) if len(first_sq) else 0.0
        return template, mean, share, spread

    # ------------------------------------------------------------------ releases
    def observe(self, released) -> None:
        """Called with each release: adds <template_i, release - expected> to every canary's score, and the
        templates' overlaps to A."""
        if self._pending is None:
            raise RuntimeError("audit: a release came without its query")
        kind, (template, mean, share, spread), extra = self._pending
        self._pending = None
        if kind == "scalar":
            t = template.double()
            r = torch.as_tensor(released, dtype=torch.float64, device=t.device).flatten()
            contribution = t @ (r - mean)
            self.overlap += (t @ t.T).cpu().numpy()
            residual = float((r - mean).pow(2).mean())
        elif kind == "vector":
            query, g = extra
            t = template.double()
            directions = self.backend.directions
            # <u_j, release> for each direction, then the template's coefficients against them
            proj = torch.zeros(len(query.directions), dtype=torch.float64, device=t.device)
            for j, d in enumerate(query.directions):
                proj[j] = sum(float((directions.tensor(d.seed, i).double() * x.double()).sum())
                              for i, x in enumerate(released))
            contribution = t @ (proj - g @ mean)
            self.overlap += (t @ g @ t.T).cpu().numpy()
            dim = sum(x.numel() for x in released)
            square = sum(float(x.double().pow(2).sum()) for x in released)
            residual = (square - 2.0 * float(mean @ proj) + float(mean @ g @ mean)) / max(1, dim)
        else:
            if kind == "dense":
                r = torch.cat([torch.as_tensor(x).double().flatten() for x in released])
                weighted = template
            else:  # embedded
                embedding, residual = released
                r = torch.cat([torch.as_tensor(embedding).double().flatten()]
                              + [torch.as_tensor(x).double().flatten() for x in residual])
                weighted = template * extra
            centred = r.to(template.device) - mean
            contribution = weighted @ centred.to(template.dtype)
            residual = float(centred.pow(2).mean())
            # m x m x d: on dense releases only every few steps, scaled up (the overlaps of gradients
            # change slowly along a run)
            if self._dense_seen % self._dense_every == 0:
                self.overlap += self._dense_every * (weighted @ template.T).double().cpu().numpy()
            self._dense_seen += 1
        self.scores += contribution.detach().double().cpu().numpy()
        self.releases += 1
        self.at_clip += share
        self._spread += spread
        self._residual += max(0.0, residual)

    @property
    def share_at_clip(self) -> float:
        return self.at_clip / self.releases if self.releases else 0.0

    def decorrelated_scores(self) -> np.ndarray:
        """(A + 4 kappa I)^-1 s, see the class docstring."""
        if not self.releases:
            return self.scores.copy()
        # the releases' own spread around their expectation, observed (public) rather than assumed: it is
        # the claimed noise plus the sampling's only when the mechanism does what it claims
        variance = self._residual / self.releases
        if not variance > 0:
            variance = self.noise_std ** 2 + self._spread / self.releases
        kappa = variance / self.rate
        a = self.rate * 0.5 * (self.overlap + self.overlap.T)
        ridge = 4.0 * kappa
        if ridge <= 0:
            ridge = 1e-9 * max(1e-300, float(np.trace(a)) / self.m)
        return np.linalg.solve(a + ridge * np.eye(self.m), self.scores)


class _ProbedBackend:
    """The run's backend, unchanged, telling the probe about each query."""

    def __init__(self, inner, probe: Probe):
        self._inner = inner
        self._probe = probe

    def query(self, query, indices, clip):
        sums = self._inner.query(query, indices, clip)
        self._probe.expect(query, clip)
        return sums

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _ProbedMechanism:
    """The run's mechanism, unchanged, showing the probe each release."""

    def __init__(self, inner, probe: Probe):
        self._inner = inner
        self._probe = probe

    def release_scalars(self, sums):
        out = self._inner.release_scalars(sums)
        self._probe.observe(out)
        return out

    def release_vector(self, tensors):
        out = self._inner.release_vector(tensors)
        self._probe.observe(out)
        return out

    def release_embedded(self, embedding, residual, residual_clip, embedding_share):
        out = self._inner.release_embedded(embedding, residual, residual_clip, embedding_share)
        self._probe.observe(out)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def final_losses(model, loss, canaries: CanarySet, device) -> np.ndarray:
    """Black-box view: each slot's loss under ``model`` (in-row minus alternate under replace-one)."""
    with torch.inference_mode():
        own = loss(model, torch.as_tensor(canaries.features, device=device),
                   torch.as_tensor(canaries.labels, device=device)).double()
        if canaries.alternate_features is not None:
            own = own - loss(model, torch.as_tensor(canaries.alternate_features, device=device),
                             torch.as_tensor(canaries.alternate_labels, device=device)).double()
    return own.cpu().numpy()
