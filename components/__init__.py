"""privzo components: pure compute (torch, numpy, dp-accounting). Never imports prefect or mlflow."""
