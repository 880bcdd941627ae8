"""``privzo reproduce nonsmooth``: a smoke run of the rate experiments through the command (tiny grids, the
same code), its docs, its MLflow parent run, and privzo's own loop matched at the first point of every series."""
import math

import mlflow

from flows.record.tracking_names import PRIVZO_KIND, MLFLOW_PARENT_RUN_ID


def test_the_reproduce_command_writes_docs_and_an_mlflow_parent_run(prefect_server, tmp_path, monkeypatch):
    from flows import cli

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "docs" / "rates.md"
    assert cli.main(["reproduce", "nonsmooth", "--quick", "--experiments", "E1", "--seeds", "0", "1",
                     "--tracking-uri", uri, "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("| yes |") == 3 and "**NO**" not in text  # every E1 series matched privzo to 1e-9
    for label in ("001 private", "001 non-private twin", "001 naive (App. E)"):
        assert f"| {label} | 2000 | 4 |" in text and f"| {label} | all (2) |" in text
    assert (tmp_path / "docs" / "rates_E1.png").stat().st_size > 10_000
    assert len(out.with_suffix(".csv").read_text().splitlines()) == 1 + 3 * 2 * 2  # series x points x seeds
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("privzo-reproduce")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get(PRIVZO_KIND) == "reproduction"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get(MLFLOW_PARENT_RUN_ID) == parent[0].info.run_id]
    assert len(children) == 6 and all("eval/goldstein_certificate_median" in r.data.metrics for r in children)
    private = [r for r in children if "twin" not in r.data.params["series"]]
    assert all(r.data.metrics["privacy/epsilon"] <= 1.0 + 1e-9 for r in private)
    artifacts = {a.path for a in client.list_artifacts(parent[0].info.run_id)} | {
        a.path for a in client.list_artifacts(parent[0].info.run_id, "plots")}
    assert {"nonsmooth_rates.md", "nonsmooth_rates.csv", "plots/E1.png"} <= artifacts
    assert all(math.isfinite(float(r.data.params["lr"])) for r in children)


def test_the_reproduce_kl_command_writes_docs_and_an_mlflow_parent_run(prefect_server, tmp_path, monkeypatch):
    """privzo reproduce kl on tiny grids: the KL paper's series matched to privzo's loop, slopes and plots written."""
    from flows import cli

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "docs" / "kl.md"
    assert cli.main(["reproduce", "kl", "--quick", "--experiments", "E7", "E9", "--seeds", "0", "1",
                     "--tracking-uri", uri, "--out", str(out)]) == 0
    text = out.read_text()
    matched = text.split("\n## E")[0]  # the match table (the slope tables say yes or no too)
    assert matched.count("| yes |") == 5 and "**NO**" not in text  # PPM Q1 and Q4, adaptive + selection, 2 DP-GD
    assert "| PPM Q4 (abs_three_halves) | 100 | 10 | 0.5 |" in text and "| DP-GD T=16 (logistic_nonconvex) | 2 |" in text
    assert (tmp_path / "docs" / "kl_E9.png").stat().st_size > 10_000
    assert len(out.with_suffix(".csv").read_text().splitlines()) == 1 + 5 * 2 * 2  # series x points x seeds
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("privzo-reproduce").experiment_id])
    parent = [r for r in runs if r.data.tags.get(PRIVZO_KIND) == "reproduction"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get(MLFLOW_PARENT_RUN_ID) == parent[0].info.run_id]
    assert len(children) == 10 and all(r.data.metrics["privacy/epsilon"] > 0 for r in children)
