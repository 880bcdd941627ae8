"""What privzo tune's selection costs: the epsilon of the best of K candidates against E[K], for each law of K,
one candidate being (1, 1e-5)-DP (500 Poisson-subsampled Gaussian steps at rate 0.05, sigma calibrated by
dp-accounting). Prints the table docs/guide/tuning.md shows; with --plot PATH, writes the figure too.

    .venv/bin/python bench/tune_cost.py --plot docs/guide/tune_cost.png
"""
from __future__ import annotations

import argparse

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

DELTA = 1e-5
MEANS = [1, 2, 4, 8, 16, 32, 64]
LAWS = {"poisson": float("inf"), "geometric": 1.0, "truncated negative binomial, shape 0.5": 0.5, "logarithmic": 0.0}


def candidate(sigma: float) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(sigma)), 500)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="write the figure here (PNG)")
    args = parser.parse_args()
    one = candidate(dp_accounting.calibrate_dp_mechanism(RdpAccountant, candidate, 1.0, DELTA))
    single = RdpAccountant().compose(one).get_epsilon(DELTA)
    table = {}
    for name, shape in LAWS.items():
        # the logarithmic law's mean is above 1 whatever its gamma
        means = [m for m in MEANS if not (shape == 0.0 and m == 1)]
        table[name] = {m: RdpAccountant().compose(dp_event.RepeatAndSelectDpEvent(one, float(m), shape))
                       .get_epsilon(DELTA) for m in means}
    print(f"one candidate: epsilon {single:.3f} at delta {DELTA:g}; the best of K, released alone:")
    print("| law of K | " + " | ".join(f"E[K] = {m}" for m in MEANS) + " |")
    print("|---|" + "---|" * len(MEANS))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[m]:.2f}" if m in row else "–" for m in MEANS) + " |")
    print("| K fixed (all K released, composed) | " + " | ".join(
        f"{RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(one, m)).get_epsilon(DELTA):.2f}"
        for m in MEANS) + " |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, row in table.items():
            ax.plot(list(row), list(row.values()), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("E[K], candidates on average")
        ax.set_ylabel(f"epsilon of the released winner (delta {DELTA:g})")
        ax.set_title("The search's cost, one candidate at epsilon 1")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
