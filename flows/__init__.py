"""privzo flows: Prefect orchestration, MLflow logging, the CLI. All side effects live here."""
import os

# privzo runs offline: no usage telemetry from the libraries it drives
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
