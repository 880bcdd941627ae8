"""DP-SGD (Abadi et al. 2016), the first-order baseline the zeroth-order estimators are measured against.

Per step, on one Poisson batch:
    g_i = grad f(x; xi_i)                                   per private example i (backprop)
    s~  = sum_i g_i * min(1, C / ||g_i||) + N(0, sigma^2 Delta^2 I_d)      (released, d-dimensional)
    update = s~ / b                                         (b = expected batch size)
One Gaussian query of L2 sensitivity Delta per step, so the step's event is the same Poisson-sampled
Gaussian as every other estimator's and the accounting is shared.
"""
from __future__ import annotations

from typing import Tuple

from components.memory_plan import Settings, Sizes, backward, chunk_rows, holds, public_phase
from components.queries import PerExampleGradients, Update
from components.registry import ESTIMATORS


class FirstOrderEstimator:
    name = "first_order"

    @property
    def queries_per_step(self) -> int:
        return 1

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return ()  # no random directions

    def step(self, ctx) -> Update:
        noisy = ctx.release(PerExampleGradients())
        return Update(dense=((tuple(noisy), 1.0 / ctx.batch_normaliser),))


@ESTIMATORS.register("first_order")
def _first_order(spec, dimension=None):
    return FirstOrderEstimator()


@holds("first_order")
def dp_sgd_memory(s: Sizes, st: Settings, centred: bool = False) -> Tuple[int, str]:
    """What DP-SGD's step holds above the weights: the per-example gradients' phase, then the release's (the
    larger), beside a public gradient held through both where the step forms one (DOPE-SGD's center,
    PDA-DPMD's mirror term), or that public gradient's own phase when larger. ``centred``: each chunk's
    per-example gradients are also copied, centred on the public gradient (DOPE-SGD)."""
    b, d, T = st.batch, s.trainable, s.trainable_bytes
    c = chunk_rows(s, b)
    held = T if st.public_gradients else 0
    # the float64 sums, a chunk's per-example gradients, and beside them in turn each use's of a tied tensor
    # (while vmap forms them) or the centred copy, what their backward kept, and one tensor's clipped sum at the
    # precision and in float64 (clipped_sums.clipped_gradient_sum)
    beside = max(s.tied, T if centred else 0)
    gradients = 8 * d + c * (T + beside) + backward(s, st, c) + (s.element + 8) * s.largest
    # the sums and the noisy sums (float64), and one tensor's noise and its scaled copy (release_vector)
    release = 16 * d + 16 * s.largest
    extra = held + max(gradients, release)
    public, public_why = public_phase(s, st)
    if public > extra:
        return public, public_why
    return extra, (f"{st.estimator}: float64 sums and per-example gradients of {d:,} trainable parameters, {c} "
                   f"of the batch's {b} rows at a time")
