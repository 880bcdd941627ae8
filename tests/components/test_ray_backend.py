"""Ray runtime: same trajectory as local, survives a killed worker, resynchronises drifted replicas."""
import copy
import os
import signal
from pathlib import Path

import pytest
import torch

import specs
from components import builders
from components.randomness import private_generator
from tests.conftest import fixed_loop, fresh_ray

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    fresh_ray(2)
    yield
    ray.shutdown()


def _built(tiny, backend, parallelism="data", estimator=None, **execution):
    d = copy.deepcopy(tiny)
    d["execution"] = {"backend": backend, "workers": 2, "parallelism": parallelism, **execution}
    if estimator:
        d["estimator"] = estimator
    return fixed_loop(d)


def _flat(built):
    return torch.cat([p.detach().flatten() for p in built.model.parameters()])


ESTIMATORS = [None, {"kind": "pazo_p", "queries": 2, "public_batches": 3, "public_batch_size": 8},
              {"kind": "pazo_s", "public_batches": 3, "public_batch_size": 8}, {"kind": "first_order"},
              {"kind": "gep", "anchors": 3, "public_batch_size": 8}]


@pytest.mark.parametrize("parallelism", ["data", "directions"])
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=["two_point", "pazo_p", "pazo_s", "first_order", "gep"])
def test_ray_matches_local(ray_cluster, tiny_spec_dict, parallelism, estimator):
    local = _built(tiny_spec_dict, "local", estimator=estimator)
    remote = _built(tiny_spec_dict, "ray", parallelism, estimator=estimator)
    try:
        local.loop.run(25)
        remote.loop.run(25)
        assert float((_flat(local) - _flat(remote)).abs().max()) <= 1e-6
        assert remote.loop.tracker.epsilon() == local.loop.tracker.epsilon()
        remote.loop.backend.verify()
        assert remote.loop.backend.resyncs == 0  # replicas agree with the driver
        # workers are told the driver's device, never left to resolve "auto" on their own
        assert tiny_spec_dict.get("execution", {}).get("device", "auto") == "auto"
        assert remote.loop.backend._spec["execution"]["device"] == remote.device.type
    finally:
        remote.loop.backend.close()


def test_ray_with_adam_matches_local(ray_cluster, tiny_spec_dict):
    """Every replica keeps its own Adam moments and applies the same released update: they stay equal."""
    tiny_spec_dict["optimizer"] = {"kind": "adam", "lr": 0.01, "steps": 60, "weight_decay": 0.01}
    _ray_matches_local(tiny_spec_dict, 20, checksum_every=5)


@pytest.mark.parametrize("sampling", [{"kind": "fixed_size", "batch_size": 40}, {"kind": "full_batch"}],
                         ids=["fixed_size", "full_batch"])
def test_ray_with_fixed_size_and_full_batch_sampling_matches_local(ray_cluster, tiny_spec_dict, sampling):
    """The driver's sampler picks the rows; workers split whatever batch it sends, up to every private row."""
    tiny_spec_dict["sampling"] = sampling
    tiny_spec_dict["privacy"]["neighboring"] = "replace_one"
    _ray_matches_local(tiny_spec_dict, 10)


@pytest.mark.parametrize("trainable", ["bias", "lora"])
def test_ray_matches_local_on_the_transformer(ray_cluster, tiny_spec_dict, trainable):
    """Workers rebuild MiniLM (with the driver's LoRA adapters, drawn from the seed) and the tokenised
    corpus from the spec alone and follow the driver's run."""
    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot", "max_length": 16}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": trainable}
    tiny_spec_dict["sampling"]["expected_batch_size"] = 16
    tiny_spec_dict["optimizer"]["lr"] = 1e-3
    local = _built(tiny_spec_dict, "local", estimator={"kind": "two_point", "queries": 2, "smoothing": 1e-3})
    remote = _built(tiny_spec_dict, "ray", estimator={"kind": "two_point", "queries": 2, "smoothing": 1e-3})
    try:
        before = _flat(local)
        local.loop.run(2)
        remote.loop.run(2)
        assert float((_flat(local) - before).abs().max()) > 1e-4  # the run moved
        assert float((_flat(local) - _flat(remote)).abs().max()) <= 1e-6
        remote.loop.backend.verify()
        assert remote.loop.backend.resyncs == 0
    finally:
        remote.loop.backend.close()


def test_killed_worker_is_rebuilt_and_the_run_is_unchanged(ray_cluster, tiny_spec_dict):
    reference = _built(tiny_spec_dict, "local")
    reference.loop.run(30)
    remote = _built(tiny_spec_dict, "ray")
    try:
        remote.loop.run(12)
        os.kill(remote.loop.backend.worker_pids()[0], signal.SIGKILL)
        remote.loop.run(30)
        assert remote.loop.backend.restarts >= 1
        assert remote.loop.tracker.steps == 30  # the interrupted step was counted once, released once
        assert remote.loop.tracker.epsilon() == reference.loop.tracker.epsilon()
        assert float((_flat(reference) - _flat(remote)).abs().max()) <= 1e-6
    finally:
        remote.loop.backend.close()


def test_drifted_replica_is_resynchronised(ray_cluster, tiny_spec_dict):
    import ray

    remote = _built(tiny_spec_dict, "ray", checksum_every=5)
    try:
        remote.loop.run(3)
        backend = remote.loop.backend
        wrong = [p.detach().cpu() + 0.5 for p in backend.directions.params]
        ray.get(backend.workers[1].load_parameters.remote(wrong, backend.optimizer.state_dict()))
        remote.loop.run(5)  # the checksum at step 5 catches it
        assert backend.resyncs == 1
        sums = ray.get([w.checksum.remote() for w in backend.workers])
        assert len(set(sums)) == 1
    finally:
        remote.loop.backend.close()


def test_ray_with_prefetch_matches_local(ray_cluster, tiny_spec_dict):
    """Workers and the driver draw the next step's directions ahead; the run is the local one."""
    estimator = {"kind": "two_point", "queries": 2, "smoothing": 1e-3, "perturbation": "cache"}
    local = _built(tiny_spec_dict, "local", estimator=estimator)
    remote = _built(tiny_spec_dict, "ray", estimator=estimator, prefetch_directions=True)
    try:
        assert remote.loop.backend.local.prefetch_directions
        local.loop.run(25)
        remote.loop.run(25)
        assert float((_flat(local) - _flat(remote)).abs().max()) <= 1e-6
        remote.loop.backend.verify()
        assert remote.loop.backend.resyncs == 0
    finally:
        remote.loop.backend.close()


def _ray_matches_local(tiny, steps, **execution):
    """The same run locally and on Ray: equal parameters, and replicas that never needed a resync."""
    local = _built(tiny, "local")
    remote = _built(tiny, "ray", **execution)
    try:
        local.loop.run(steps)
        remote.loop.run(steps)
        assert float((_flat(local) - _flat(remote)).abs().max()) <= 1e-6
        remote.loop.backend.verify()
        assert remote.loop.backend.resyncs == 0
    finally:
        remote.loop.backend.close()


def _driver_read(tiny):
    """What a Ray driver has read and resolved before its workers start (and read the data themselves)."""
    d = copy.deepcopy(tiny)
    d["execution"] = {"backend": "ray", "workers": 2}
    spec = specs.spec_from_dict(d)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    return spec, data, resolved


def _start_workers(resolved, data):
    return builders.build_loop(resolved, data, noise_generator=private_generator(11),
                               sampling_generator=private_generator(12))


def test_workers_read_the_users_file_and_refuse_rows_that_changed(ray_cluster, tiny_spec_dict, tmp_path):
    """Workers read a file source themselves. If it changed after the driver read it, the indices the
    driver sends would name other rows than the ones sampled and accounted: the worker is refused."""
    from components.runtime.ray_backend import DataChanged
    from tests.conftest import write_digits_file

    path = write_digits_file(tmp_path / "rows.csv", rows=range(1500))
    tiny_spec_dict["data"] = {"declared_private_rows": 1000, "source": {"kind": "file", "path": str(path), "label": "digit", "classes": list(range(10))},
                              "split": {"kind": "hashed", "public": 0.04, "test": 0.2}}
    _ray_matches_local(tiny_spec_dict, 10)

    spec, data, resolved = _driver_read(tiny_spec_dict)
    write_digits_file(path, rows=range(1797))  # new rows land between the driver's read and the workers'
    with pytest.raises(DataChanged, match="a Ray worker loaded different private or public rows than the driver"):
        _start_workers(resolved, data)
    # new rows that are all public leave the private rows as they were, but not their scaling: refused too
    grown = builders.load_data(spec)
    public_only = sorted(set(grown.public.fingerprints) - set(data.public.fingerprints))
    assert public_only
    full = builders._table(spec.data.source, None)[0]
    extra = [i for i, fp in enumerate(full.row_fingerprints()) if fp in set(public_only)]
    write_digits_file(path, rows=list(range(1500)) + extra)
    assert builders.load_data(spec).private.fingerprints == data.private.fingerprints
    with pytest.raises(DataChanged):
        _start_workers(resolved, data)


def test_workers_read_an_image_folder_and_refuse_one_that_changed(ray_cluster, tiny_spec_dict, tmp_path):
    """Image folders take the same road as files: each worker decodes the folder itself, and an image
    added after the driver's read is refused before any private query."""
    from PIL import Image

    from components.runtime.ray_backend import DataChanged
    from tests.components.test_images import NAMES, write_digits_images

    write_digits_images(tmp_path / "digits", n=600)
    tiny_spec_dict["data"] = {"declared_private_rows": 1000, "source": {"kind": "images", "path": str(tmp_path / "digits"), "classes": NAMES, "size": 8},
                              "split": {"kind": "hashed", "public": 0.04, "test": 0.2}}
    tiny_spec_dict["model"] = {"kind": "cnn", "channels": [4]}
    _ray_matches_local(tiny_spec_dict, 5)

    _, data, resolved = _driver_read(tiny_spec_dict)
    for shade in range(120, 130):  # ten new images: by hash some are private (a test-only one would change nothing)
        Image.new("L", (8, 8), shade).save(tmp_path / "digits" / "seven" / f"late-{shade}.png")
    with pytest.raises(DataChanged):
        _start_workers(resolved, data)


def replica_of_another_model(spec_dict: dict) -> tuple:
    """A worker whose node holds another copy of the pretrained model: one frozen weight differs."""
    digest, backend = builders.build_replica(spec_dict)
    with torch.no_grad():
        backend.model.encoder.embeddings.word_embeddings.weight[0, 0] += 1.0
    return digest, backend


def test_a_worker_that_builds_other_frozen_weights_is_refused(ray_cluster, tiny_spec_dict, monkeypatch):
    """The driver pushes only the trainable parameters; the frozen encoder each worker loads itself. A worker
    whose copy differs would train another function, so it is refused before any query, naming a tensor."""
    from components.runtime.ray_backend import ModelChanged

    tiny_spec_dict["data"]["source"] = {"kind": "text", "name": "chatterbot", "max_length": 16}
    tiny_spec_dict["model"] = {"kind": "hf", "name": "minilm", "trainable": "head"}
    tiny_spec_dict["sampling"]["expected_batch_size"] = 16
    spec, data, resolved = _driver_read(tiny_spec_dict)
    monkeypatch.setattr(builders, "build_replica", replica_of_another_model)
    with pytest.raises(ModelChanged, match=r"^model: the Ray worker on node .* built other weights than the driver "
                                           r"from the same spec \(1 tensors differ, first "
                                           r"encoder.embeddings.word_embeddings.weight\); every node must read"):
        _start_workers(resolved, data)


def test_a_local_ray_keeps_its_session_in_a_private_folder_removed_at_exit(tmp_path):
    """Ray's logs hold a marker per task (a search's shares): privzo's local Ray writes them where only its OS
    user reads, and nothing of the session stays once the process ends."""
    import subprocess
    import sys

    script = ("import os, stat, ray; from components.runtime import ray_backend as rb; rb.connect('local', 1); "
              "d = ray._private.worker._global_node.get_session_dir_path(); root = os.path.dirname(os.path.dirname(d)); "
              "print(root, oct(stat.S_IMODE(os.stat(root).st_mode)), os.path.isdir(os.path.join(d, 'logs')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stderr[-2000:]
    root, mode, logs = out.stdout.split()
    assert Path(root).name.startswith("privzo-ray-") and mode == "0o700" and logs == "True"
    assert not Path(root).exists()
