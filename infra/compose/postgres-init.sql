-- Runs once, when the volume is new: the database privzo (POSTGRES_DB, owner privzo) keeps the privacy
-- ledger; Prefect and MLflow each get their own.
CREATE DATABASE prefect OWNER privzo;
CREATE DATABASE mlflow OWNER privzo;
