"""GEP, gradient embedding perturbation (Yu, Zhang, Chen, Yin and Liu, ICLR 2021): first-order private
training guided by public data, one of the PAZO paper's FO+PUB baselines.

Per step, with b' public rows and one Poisson batch of private rows:
    A   = the b' public rows' per-example gradients, [b', d]           (anchor gradients; public)
    B   = the top-k right singular vectors of A, [k, d], orthonormal    (the anchor subspace; public)
    w_i = B g_i,  r_i = g_i - B^T w_i                                   per private example i (backprop)
    w~  = sum_i clip(w_i, C1) + N(0, (sigma Delta_1)^2 / s  I_k)        (embedding, k numbers)
    r~  = sum_i clip(r_i, C2) + N(0, (sigma Delta_2)^2 / (1-s) I_d)     (residual, d numbers)
    update = (B^T w~ + r~) / b
C1 = mechanism.clip, C2 = residual_clip, Delta = C (add/remove) or 2C (replace-one), s = embedding_share.
Released together, the two sums are one Gaussian query of multiplier sigma (the mechanism's
release_embedded), so the step's event is the same Poisson-sampled Gaussian as every other estimator's.
The paper's power iteration approximates B; here it comes from the eigendecomposition of the
anchors' Gram matrix. Its default, the same noise
multiplier for both parts, is s = 1/2.
"""
from __future__ import annotations

from typing import Tuple

import torch

from components.memory_plan import Settings, Sizes, backward, chunk_rows, holds
from components.queries import EmbeddedGradients, Update
from components.registry import ESTIMATORS


def anchor_basis(anchors: torch.Tensor, k: int) -> torch.Tensor:
    """[k, d] orthonormal rows: the top-k right singular vectors of the anchor gradients A [m, d] (k <= m),
    from the eigendecomposition of the m x m Gram matrix A A^T, so that nothing larger than A and the basis
    is formed (a transformer's d is tens of millions). A direction whose singular value is zero,
    or too small to resolve, is a zero row: it carries no signal, and the split stays exact for any basis.
    The basis is public: neither its accuracy nor its orthonormality bears on privacy, only on utility."""
    if not 1 <= k <= anchors.shape[0]:
        raise ValueError(f"estimator.anchors: need 1 <= k <= {anchors.shape[0]} public rows, got {k}")
    a = anchors
    gram = a @ a.T  # in A's precision
    # a non-finite entry of A (or one whose square overflows) makes its row's diagonal entry non-finite:
    # checked on the m x m Gram matrix, since isfinite(A) would form temporaries of 1.75 times A's size
    if not bool(torch.isfinite(gram.diagonal()).all()):
        raise FloatingPointError("estimator gep: the public anchor gradients are not finite (the model has "
                                 "diverged); lower optimizer.lr or the warm start's lr")
    values, vectors = torch.linalg.eigh(gram.double())
    order = torch.argsort(values, descending=True)[:k]
    singular = values[order].clamp(min=0.0).sqrt()
    # the Gram matrix holds s_j^2 to about eps * s_0^2: below this ratio to s_0 a direction is rounding
    tolerance = float(singular[0]) * 10 * torch.finfo(a.dtype).eps ** 0.5
    resolved = singular > tolerance if tolerance > 0 else torch.zeros_like(singular, dtype=torch.bool)
    scale = torch.where(resolved, 1.0 / torch.where(resolved, singular, 1.0), 0.0)
    basis = (vectors[:, order] * scale).T.to(a.dtype) @ a  # v_j = u_j^T A / s_j, [k, d]
    # a singular vector's sign is arbitrary; fix it (largest entry positive) so that the same anchors give
    # the same basis wherever they are decomposed
    largest = torch.stack([row.abs().argmax() for row in basis])  # a row at a time: abs() copies it
    signs = torch.sign(basis.gather(1, largest[:, None]))
    return basis.mul_(torch.where(signs == 0, 1.0, signs))  # in place: the basis is [k, d]


class GepEstimator:
    name = "gep"

    def __init__(self, anchors: int, public_batch_size: int, residual_clip: float, embedding_share: float):
        if anchors < 1 or anchors > public_batch_size:
            raise ValueError("estimator.anchors: must be between 1 and public_batch_size")
        if not (0 < embedding_share < 1) or residual_clip <= 0:
            raise ValueError("estimator: embedding_share must be in (0, 1) and residual_clip > 0")
        self.k = anchors
        self.public_batch_size = public_batch_size
        self.residual_clip = residual_clip
        self.embedding_share = embedding_share

    @property
    def queries_per_step(self) -> int:
        return 1

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return ()  # no random directions

    def step(self, ctx) -> Update:
        (batch,) = ctx.public.batches(ctx.step, 1, self.public_batch_size)
        basis = anchor_basis(ctx.public.per_example_gradients(batch), self.k)
        embedding, residual = ctx.release(EmbeddedGradients(basis, self.residual_clip, self.embedding_share))
        # B^T w~ in float64, one basis row at a time: basis.double() would be a second, doubled [k, d] copy
        flat = torch.zeros(basis.shape[1], dtype=torch.float64, device=basis.device)
        for row, weight in zip(basis, embedding.tolist()):
            flat.add_(row.double(), alpha=weight)
        update, start = [], 0
        for r in residual:
            update.append(r + flat[start:start + r.numel()].view(r.shape).to(dtype=r.dtype, device=r.device))
            start += r.numel()
        return Update(dense=((tuple(update), 1.0 / ctx.batch_normaliser),))


@ESTIMATORS.register("gep")
def _gep(spec, dimension=None):
    est = spec.estimator
    clip = getattr(spec.mechanism, "clip", None)
    residual_clip = est.residual_clip or clip or 1.0  # without a mechanism nothing is clipped
    return GepEstimator(est.anchors, est.public_batch_size, residual_clip, est.embedding_share)


@holds("gep")
def _gep_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """As bench/memory.py's guard: the largest of forming the [b', d] anchor matrix from chunks of public rows'
    per-example gradients (then the [k, d] basis), splitting the private ones on the basis in chunks of a third
    (g, r and their product), and the release's float64 d-vectors beside the basis."""
    d, T, k, pub = s.trainable, s.trainable_bytes, st.anchors, st.public_batch
    c = chunk_rows(s, pub)
    anchor = pub * T + max(2 * c * T, k * T) + c * s.tied + backward(s, st, c)
    split = k * T + 2 * 8 * d + chunk_rows(s, st.batch, 3) * (4 * T + s.tied)
    return max(anchor, split, k * T + 6 * 8 * d), (f"gep: per-example gradients of {d:,} trainable parameters "
                                                  f"for {pub} public rows and a basis of {k}")
