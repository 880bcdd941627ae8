"""privzo flows: Prefect orchestration, MLflow logging, the CLI. All side effects live here; importing
them has none (the command sets its environment: flows/cli/, COMMAND_ENVIRONMENT)."""
