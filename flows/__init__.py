"""privzo flows: Prefect orchestration, MLflow logging, the CLI. All side effects live here."""
import os

# privzo runs offline: no usage telemetry from the libraries it drives
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
# `privzo run` with no Prefect server starts Prefect's temporary one; its 20 s start-up allowance is too
# short on a busy laptop or a 2-core CI box (the first run then fails before any work), so allow 120 s
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
