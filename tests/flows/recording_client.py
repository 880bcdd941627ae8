"""An MLflow client kept in memory: what a sweep cell sends to MLflow (a tracking database costs seconds to
create), with each metric's history as MLflow keeps it (value and step)."""
from collections import defaultdict
from types import SimpleNamespace


class RecordingClient:
    def __init__(self):
        self.metrics, self.tags, self.params, self.status = {}, {}, {}, None
        self.history = defaultdict(list)

    def create_run(self, experiment_id, run_name, tags):
        return SimpleNamespace(info=SimpleNamespace(run_id="child"))

    def log_batch(self, run_id, params=(), metrics=(), tags=()):
        self.metrics.update({m.key: m.value for m in metrics})  # the latest, as the run's page shows them
        for m in metrics:
            self.history[m.key].append(m)
        self.params.update({p.key: p.value for p in params})
        self.tags.update({t.key: t.value for t in tags})

    def get_metric_history(self, run_id, key):
        return list(self.history[key])

    def set_terminated(self, run_id, status):
        self.status = status

    def log_artifact(self, run_id, local_path, artifact_path=None):
        pass
