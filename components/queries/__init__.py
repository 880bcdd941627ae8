"""Queries: what an estimator asks of the private rows (``query``: directions, points, clips) and what a
backend answers where the rows live (``clipped_sums``: per-example values or vectors, each clipped, summed).
Only the clipped sums leave a backend.

It stands below the estimators and the runtime, above the direction engine."""
from components.queries.clipped_sums import NON_FINITE_HANDLING, evaluate_query
from components.queries.query import (
    DENSE_QUERIES,
    Dense,
    EmbeddedGradients,
    FiniteDifferences,
    LossValues,
    PerExampleBall,
    PerExampleGradientAt,
    PerExampleGradients,
    PerExampleSphere,
    Query,
    Seeded,
    Update,
    VectorFiniteDifferences,
)

__all__ = ["DENSE_QUERIES", "Dense", "EmbeddedGradients", "FiniteDifferences", "LossValues", "NON_FINITE_HANDLING",
           "PerExampleBall", "PerExampleGradientAt", "PerExampleGradients", "PerExampleSphere", "Query", "Seeded",
           "Update", "VectorFiniteDifferences", "evaluate_query"]
