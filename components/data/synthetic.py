"""The synthetic source: rows simulated from a public seed for a theory family's problem (every row is
private; the problem's family, in specs/traits.py PROBLEMS, says which module simulates it)."""
from __future__ import annotations

import numpy as np

from components.data.table import Table
from components.registry import SOURCES
from specs.traits import KL, PROBLEMS


@SOURCES.register("synthetic")
def _synthetic(source, model_tokenizer=None, public_flag=None):
    if PROBLEMS[source.problem] == KL:
        from components.families.kl.problems import kl_rows

        rows = kl_rows(source.problem, source.dimension, source.rows, source.data_seed)
    else:
        from components.families.nonsmooth.problems import load_w_linear

        rows = load_w_linear(source.dimension, source.rows, source.noise_radius, source.data_seed)
    layout = f"synthetic:{source.problem}:{source.dimension}:{source.noise_radius}:{source.data_seed}"
    return Table(source.name, rows, np.zeros(len(rows), dtype=np.int64), 1, None, layout=layout), "none"
