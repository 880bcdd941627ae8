import copy
import os
import shutil
from pathlib import Path

import pytest

# one torch thread for the tests and, by inheritance, their subprocesses (CLI runs, the local stack's flow
# runs): on the project's busy 2-core machine the tiny models' steps ran ~70x slower on torch's default of
# one thread per core (threads spinning against each other), and that was most of the suite's time. The
# bench/ tests set their subprocesses' environment themselves; tests/flows/test_audit.py sets 2 threads to
# check that the audit (which runs on 1) restores them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray lowers its workers to nice 15 (a driver first); beside the suite's other processes, all at nice 0, the
# actors of every Ray test then got almost no CPU: two took 68 s to start beside 3 busy processes, 13 s at
# nice 0 (components/runtime/ray_backend.py starts privzo's own local Ray so too)
os.environ.setdefault("RAY_worker_niceness", "0")
# what `privzo` sets before Prefect and MLflow are imported (no telemetry, time for Prefect's temporary
# server), for the flows the tests call in-process too
from flows.cli import COMMAND_ENVIRONMENT  # noqa: E402

for _name, _value in COMMAND_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

if not torch.cuda.is_available():
    # without a GPU, the GPU's Triton kernels (components/directions/philox.py) run on the CPU through
    # Triton's interpreter in tests/components/test_philox.py; production never takes that path on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "specs" / "examples"
# the examples whose model a package ships; the language-model ones (chatterbot_lm_*) name the decoder that
# recipes/pretrain_decoder.py makes in ~/.privzo/models, and tests/flows/test_lm_examples.py makes a tiny one
SHIPPED_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("chatterbot_lm_"))

TINY = {
    "name": "tiny-digits",
    "seed": 3,
    "data": {"source": {"kind": "sklearn", "name": "digits"}, "split": {"kind": "fraction", "public": 0.04, "test": 0.2,
                                                                          "imbalance": [1.0, 0.85]},
             "declared_private_rows": 1385},  # the split of seed 3 has 1385 private rows
    "model": {"kind": "linear"},
    "estimator": {"kind": "two_point", "queries": 2, "smoothing": 1e-3},
    "mechanism": {"kind": "gaussian", "clip": 2.0},
    "privacy": {"epsilon": 2.0, "delta": "auto", "accountant": "rdp"},
    "sampling": {"kind": "poisson", "expected_batch_size": 64},
    "optimizer": {"kind": "sgd", "lr": 0.02, "steps": 60},
    "tracking": {"log_every": 20},
}


@pytest.fixture
def tiny_spec_dict():
    return copy.deepcopy(TINY)


def fixed_loop(spec_dict: dict):
    """A spec mapping's loop, planned and built with the tests' fixed private generators (noise 11, sampling
    12): two builds of one spec, on any backend, follow one trajectory."""
    import specs
    from components import builders
    from components.randomness import private_generator

    spec = specs.spec_from_dict(spec_dict)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    return builders.build_loop(resolved, data, noise_generator=private_generator(11),
                               sampling_generator=private_generator(12))


def write_digits_file(path: Path, rows=None, labels_as=None) -> Path:
    """scikit-learn's digits as a user's file (CSV, Parquet or JSON Lines by suffix; a Hugging Face save_to_disk
    folder for the suffix .hf): 64 pixel columns and ``digit``;
    ``rows`` selects and orders rows, ``labels_as`` maps each class number to what the file holds."""
    import pandas as pd

    from components.data import load_sklearn

    table = load_sklearn("digits")
    frame = pd.DataFrame(table.features, columns=[f"px{i}" for i in range(64)])
    frame["digit"] = table.labels if labels_as is None else [labels_as[int(y)] for y in table.labels]
    if rows is not None:
        frame = frame.iloc[list(rows)]
    if path.suffix == ".parquet":
        frame.to_parquet(path)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif path.suffix == ".hf":
        save_to_disk(frame, path)
    else:
        frame.to_csv(path, index=False)
    return path


def save_to_disk(frame, path: Path, features=None, splits=None) -> Path:
    """``frame`` as Hugging Face datasets writes a dataset with save_to_disk (a DatasetDict of ``splits`` names,
    each holding the frame, when given)."""
    import datasets

    datasets.disable_progress_bars()
    one = datasets.Dataset.from_pandas(frame, features=features, preserve_index=False)
    (datasets.DatasetDict({name: one for name in splits}) if splits else one).save_to_disk(str(path))
    return path


@pytest.fixture(scope="session")
def mlflow_schema(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store, made once: a new store runs MLflow's ~50 Alembic migrations (~3 s here)."""
    import mlflow

    path = tmp_path_factory.mktemp("mlflow-schema") / "mlflow.db"
    cwd = os.getcwd()
    os.chdir(path.parent)  # its Default experiment's ./mlruns resolves here, never in the repository
    try:
        mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    finally:
        os.chdir(cwd)
    return path


def copy_mlflow_store(schema: Path, path: Path) -> str:
    """A new MLflow store at ``path`` (a copy of ``schema``, what MLflow would create there), as its URI."""
    shutil.copyfile(schema, path)
    return f"sqlite:///{path}"


@pytest.fixture
def mlflow_db(mlflow_schema, tmp_path) -> str:
    """``sqlite:///<tmp_path>/mlflow.db``, already holding MLflow's tables."""
    return copy_mlflow_store(mlflow_schema, tmp_path / "mlflow.db")


@pytest.fixture(scope="session", autouse=True)
def _isolated_prefect_home(tmp_path_factory):
    """Prefect keeps state under PREFECT_HOME; tests never touch the user's."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ.setdefault("PRIVZO_FINGERPRINT_KEY", "privzo-tests")  # no key file in the user's home
    # a spec without tracking.uri or budget.ledger reads these; a user's own servers are never the tests'
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("PRIVZO_LEDGER_URL", None)
    yield


@pytest.fixture(autouse=True)
def _no_tracking_uri_left_behind():
    """mlflow.set_tracking_uri writes MLFLOW_TRACKING_URI into the process environment, which a spec that
    names no store (and every subprocess) would then follow: no test leaves it to the next."""
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session")
def prefect_server():
    """A real temporary Prefect server on 127.0.0.1 for the whole session, stopped at the end; yields its
    API URL (a subprocess given it as PREFECT_API_URL uses this server instead of starting its own)."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield prefect.settings.PREFECT_API_URL.value()


def ledger_of(spec):
    """The ledger a spec's runs are charged to, as a run's entry opens it (flows.ledger.Budget) and hands in."""
    from flows.ledger import PrivacyLedger

    return PrivacyLedger.open(spec.budget.ledger)


def fresh_ray(num_cpus: int) -> None:
    """A new local Ray of ``num_cpus`` CPUs for this process: one a test left running (a run on Ray connects to
    this process's Ray and keeps it) is stopped first, so a test's Ray is the same whatever ran before it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


# the longest work first: on 2 cores the suite's xdist workers then finish together, instead of one waiting out
# a long test (or the local-stack modules, one unit of about 9 minutes) that it began near the end. Safe in any
# order: a module that needs its own Ray starts it fresh (fresh_ray)
SLOW_FIRST = ("tests/flows/test_deployment.py", "tests/flows/test_nightly.py", "tests/components/test_ray_backend.py",
              "tests/flows/test_blocks.py", "tests/flows/test_private_train.py", "tests/flows/test_lm_examples.py",
              "tests/test_bench.py", "tests/flows/test_ledger.py", "tests/flows/test_resume.py", "tests/flows/test_tune.py",
              "tests/flows/test_served_model.py", "tests/components/test_protocols.py",
              "tests/components/test_examples_learn.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(SLOW_FIRST)))  # stable: a module's order stays


def pytest_collection_finish(session):
    """The local-stack modules share one stack folder per checkout, so they must run on one xdist worker
    (``xdist_group``). pytest-xdist applies a group by renaming each test's node id, which pytest 9.2 no longer
    reads (its ids became structured): the groups are then silently ignored and two stacks race. Refuse that."""
    if not getattr(session.config.option, "loadgroup", False):  # set in xdist's workers under --dist loadgroup
        return
    ignored = [item.nodeid for item in session.items
               if any(True for _ in item.iter_markers("xdist_group")) and "@" not in item.nodeid]
    if ignored:
        raise pytest.UsageError(f"pytest-xdist's xdist_group is not applied here (pytest {pytest.__version__}): "
                                f"{ignored[0]} would run on any worker; install the pytest pyproject.toml pins")
