"""The MLflow record of privzo's runs: the names it writes (tracking_names), what a run logs (tracking,
reporting, transcript), the chain of registered versions a model started from (lineage), registration, and
the owner's verify and promotion (verify, verify_report, promotion), with the team stack's MLflow door
(mlflow_app). It stands on the ledger, which it asks, and below the flows, which it serves."""
