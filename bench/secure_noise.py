"""What secure noise (privacy.noise: secure) costs a private step, per estimator, against the fast default.

For each estimator kind it builds the digits example spec's loop twice on the local backend, one with
secure noise (OpenDP's discrete Gaussian, exact Bernoulli batches from secrets) and one with fast noise
(torch's generator), and times single steps of the two interleaved, in alternating order, so a slow spell
of the machine falls on both. Columns, each secure / fast:
  ratio   median step over median step: the step time a user sees;
  paired  median over steps of each secure step over the fast step beside it (less moved by slow spells);
  cpu     the process's CPU time per step, background draws included: the cost where no core is idle;
  model   1 + (what batch selection and the release add on the main thread, plus q secure draws for the
          estimators that draw them on the background thread) / the fast step, from parts timed on their
          own over many repeats. Whole steps move by a few % on a shared 2-core machine; the parts do not,
          so privacy.noise: auto's rule rests on this column.
A first row, (control), runs two_point with fast noise in both loops: its ratios are the timing noise.
Then two_point on wider MLPs (--sizes): the share falls with batch rows x parameters, which sets auto's
threshold (components/randomness.py). Last, the d-dimensional release alone (DP-SGD's, DPGD-0th's,
GEP's residual) at several d: microseconds per coordinate.

    python bench/secure_noise.py                     # everything, about two minutes on 2 cores
    python bench/secure_noise.py --estimators two_point pazo_m --steps 400 --sizes --dims

Secure scalar noise is drawn ahead on a background thread (components/randomness.py); by default torch
runs on one thread (--threads), leaving that thread a core, as execution.threads advises for small models.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

import specs
from components import builders
from components.mechanisms import GaussianMechanism
from components.mechanisms.gaussian import inflated_std, secure_grid_exponent
from components.randomness import SecureSource, private_generator, secure_discrete_gaussian

EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"
SPECS = {"two_point": "digits_dpzero", "pazo_m": "digits_pazo_m", "pazo_p": "digits_pazo_p",
         "pazo_s": "digits_pazo_s", "dpgd_0th": "digits_dpgd_0th", "first_order": "digits_dp_sgd",
         "gep": "digits_gep"}
DENSE = ("dpgd_0th", "first_order", "gep")


class SameRows:
    """Timing only: each step draws its batch with the run's own sampler (secure or fast, so that cost
    counts), then computes on the same expected-size rows, so the two loops do the same forward work
    (Poisson batches of 64 expected rows vary by +-8, which moves a step more than the noise does)."""

    def __init__(self, sampler):
        self._sampler = sampler
        self._rows = torch.arange(sampler.expected_batch_size)

    def sample(self) -> torch.Tensor:
        self._sampler.sample()
        return self._rows

    def __getattr__(self, name):
        return getattr(self._sampler, name)


def loop_for(kind: str, noise: str, hidden=None):
    data_spec = yaml.safe_load((EXAMPLES / f"{SPECS[kind]}.yaml").read_text())
    if hidden is not None:
        data_spec["model"] = {"kind": "mlp", "hidden": list(hidden)}
    data_spec["execution"] = {"backend": "local"}
    data_spec["privacy"]["noise"] = noise
    data_spec.pop("tracking", None)
    spec = specs.spec_from_dict(data_spec)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data)
    builders.public_warm_start(resolved, built)
    assert built.loop.mechanism.noise_source == noise
    built.loop.sampler = SameRows(built.loop.sampler)
    return built.loop


def one_step(loop):
    wall, cpu = time.perf_counter(), time.process_time()
    loop.run(loop.step + 1)
    return time.perf_counter() - wall, time.process_time() - cpu


def median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def parts_us(kind: str, loop, repeats: int) -> float:
    """Batch selection plus one step's release on this loop's sampler and mechanism, on stand-in sums (a
    d-dimensional one for GEP too, whose k-dim embedding adds little)."""
    mech, q = loop.mechanism, loop.estimator.queries_per_step
    params = loop.backend.directions.params
    if kind in DENSE:
        tensors = [torch.zeros_like(p) for p in params]
        release = (lambda: mech.release_vector(tensors))
    else:
        sums = torch.zeros(q, dtype=torch.float64)
        release = (lambda: mech.release_scalars(sums))
    return median_us(lambda: (loop.sampler.sample(), release()), repeats)


def draw_us(repeats: int = 15, block: int = 256) -> float:
    """CPU time of one secure scalar draw, as the background thread makes them (blocks of 256)."""
    std = 0.5
    k = secure_grid_exponent(std)
    scale = inflated_std(std, 0.25, 1, k)
    secure_discrete_gaussian(block, scale, k)  # OpenDP loaded, measurement built
    return median_us(lambda: secure_discrete_gaussian(block, scale, k), repeats) / block


def bench_estimator(kind: str, steps: int, parts_repeats: int, hidden=None, per_draw_us: float = 0.0,
                    control: bool = False) -> dict:
    """``control``: fast noise in both loops, so the ratios show the timing noise alone."""
    loops = {noise: loop_for(kind, "fast" if control else noise, hidden) for noise in ("secure", "fast")}
    for loop in loops.values():  # warm: imports, the first pool of secure draws, caches
        loop.run(loop.step + 3)
    wall, cpu = {"secure": [], "fast": []}, {"secure": 0.0, "fast": 0.0}
    for r in range(steps):
        order = ("secure", "fast") if r % 2 == 0 else ("fast", "secure")
        for noise in order:
            w, c = one_step(loops[noise])
            wall[noise].append(w)
            cpu[noise] += c  # the process's CPU time: the background draws land in some step's
    secure_ms = statistics.median(wall["secure"]) * 1e3
    fast_ms = statistics.median(wall["fast"]) * 1e3
    parts = {noise: parts_us(kind, loops[noise], parts_repeats) for noise in ("secure", "fast")}
    # q scalar draws a step run on the background thread; a d-dim release draws on the main thread (parts)
    background = 0.0 if kind in DENSE or control else loops["secure"].estimator.queries_per_step * per_draw_us
    return {"kind": kind, "secure_ms": secure_ms, "fast_ms": fast_ms, "ratio": secure_ms / fast_ms,
            "paired": statistics.median(s / f for s, f in zip(wall["secure"], wall["fast"])),
            "cpu_ratio": cpu["secure"] / cpu["fast"],
            "parts_secure_us": parts["secure"], "parts_fast_us": parts["fast"],
            "model": 1.0 + (parts["secure"] - parts["fast"] + background) / (fast_ms * 1e3)}


def bench_dense(dims, repeats: int):
    rows = []
    for d in dims:
        tensors = [torch.zeros(d)]
        secure = GaussianMechanism(1.0, 1.0, 1, "add_remove", SecureSource())
        fast = GaussianMechanism(1.0, 1.0, 1, "add_remove", private_generator())
        secure.release_vector(tensors)  # OpenDP loaded, measurement built
        reps = max(1, repeats if d <= 10_000 else repeats // 3)
        s = median_us(lambda: secure.release_vector(tensors), reps)
        f = median_us(lambda: fast.release_vector(tensors), reps)
        rows.append((d, s, f))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimators", nargs="*", default=list(SPECS), choices=list(SPECS))
    parser.add_argument("--steps", type=int, default=200, help="interleaved steps per estimator (q scalars)")
    parser.add_argument("--dense-steps", type=int, default=12, help="interleaved steps for d-dim releases")
    parser.add_argument("--parts-repeats", type=int, default=300)
    parser.add_argument("--sizes", nargs="*", default=["512", "1024", "2048", "1024,1024"],
                        help="two_point on these MLP hidden sizes (comma-separated layers)")
    parser.add_argument("--size-steps", type=int, default=80)
    parser.add_argument("--dims", nargs="*", type=int, default=[1_000, 10_000, 100_000])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    per_draw = draw_us()
    print(f"cpu, torch threads {torch.get_num_threads()}; secure = OpenDP discrete Gaussian + secrets Bernoulli; "
          f"one secure scalar draw: {per_draw:.1f} us")
    print(f"{'estimator':<12} {'secure ms':>10} {'fast ms':>9} {'ratio':>7} {'paired':>7} {'cpu':>7}   "
          f"{'parts us':>17} {'model':>7}")
    if args.estimators:
        r = bench_estimator("two_point", args.steps, args.parts_repeats, control=True)
        print(f"{'(control)':<12} {r['secure_ms']:>10.3f} {r['fast_ms']:>9.3f} {r['ratio']:>7.3f} {r['paired']:>7.3f} "
              f"{r['cpu_ratio']:>7.3f}   two_point, fast in both loops: the timing noise", flush=True)
    for kind in args.estimators:
        dense = kind in DENSE
        r = bench_estimator(kind, args.dense_steps if dense else args.steps,
                            max(3, args.parts_repeats // 30) if dense else args.parts_repeats, per_draw_us=per_draw)
        print(f"{kind:<12} {r['secure_ms']:>10.3f} {r['fast_ms']:>9.3f} {r['ratio']:>7.3f} {r['paired']:>7.3f} "
              f"{r['cpu_ratio']:>7.3f}   {r['parts_secure_us']:>8.0f} / {r['parts_fast_us']:<6.0f} "
              f"{r['model']:>7.3f}", flush=True)
    if args.sizes:
        print("two_point on wider MLPs (64 expected rows):")
        for size in args.sizes:
            hidden = [int(h) for h in size.split(",")]
            params = sum(p.numel() for p in loop_for("two_point", "fast", hidden).backend.directions.params)
            r = bench_estimator("two_point", args.size_steps, args.parts_repeats // 3, hidden, per_draw_us=per_draw)
            print(f"  hidden {str(hidden):<13} params {params:>9,}  rows x params {64 * params:>12,}: "
                  f"ratio {r['ratio']:.3f}, paired {r['paired']:.3f}, cpu {r['cpu_ratio']:.3f}, model {r['model']:.3f} "
                  f"(fast step {r['fast_ms']:.2f} ms)", flush=True)
    if args.dims:
        print("d-dimensional release alone (one mechanism.release_vector of d float32 coordinates):")
        for d, s, f in bench_dense(args.dims, 9):
            print(f"  d={d:>7}: secure {s / 1e3:9.2f} ms ({s / d:6.2f} us/coord), fast {f / 1e3:7.3f} ms "
                  f"({f / d:6.3f} us/coord), ratio {s / f:8.1f}", flush=True)


if __name__ == "__main__":
    main()
