"""data.source.kind images: a folder per class, decoded with Pillow, read as the spec declares."""
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import specs
from components import builders, models
from components.data import load_images
from components.randomness import private_generator

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def write_digits_images(root, n=None):
    """scikit-learn's digits as 8x8 grey PNGs, root/<digit name>/<index>.png (pixels 0-16 -> 0-240)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    n = len(y) if n is None else n
    for i in range(n):
        folder = root / NAMES[y[i]]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((x[i].reshape(8, 8) * 15).astype(np.uint8)).save(folder / f"{i:04d}.png")
    return x[:n], y[:n]


def test_pixels_and_labels_are_the_images_and_the_declared_class_order(tmp_path):
    x, y = write_digits_images(tmp_path, 200)
    table = load_images(tmp_path, classes=NAMES, size=8, mode="L")
    assert table.features.dtype == np.float32 and table.features.shape[1] == 64
    assert table.fixed_scale == pytest.approx(1 / 255) and table.layout == "images:L:8;classes=by-name"
    # every image comes back exactly (same pixels, same label), whatever order the folders are read in
    want = {(row.tobytes(), int(label)) for row, label in zip((x * 15).astype(np.float32), y)}
    got = {(row.tobytes(), int(label)) for row, label in zip(table.features, table.labels)}
    assert got <= want and len(table) >= 190  # exact duplicate digits are dropped, as for every source
    reordered = load_images(tmp_path, classes=NAMES[::-1], size=8, mode="L")
    assert {(r.tobytes(), 9 - int(label)) for r, label in zip(reordered.features, reordered.labels)} == got


def test_colour_images_are_channels_first_and_resized(tmp_path):
    for cls, colour in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
        (tmp_path / cls).mkdir()
        for k in range(3):
            Image.new("RGB", (20, 12), tuple(min(255, c + 10 * k) for c in colour)).save(tmp_path / cls / f"{k}.jpg",
                                                                                         quality=100)
    table = load_images(tmp_path, classes=["red", "blue"], size=6, mode="RGB")
    assert table.features.shape == (6, 3 * 6 * 6)
    red = table.features[table.labels == 0].reshape(-1, 3, 6, 6)
    assert red[:, 0].min() > 200 and red[:, 2].max() < 60  # channel 0 is red in every pixel


def test_hidden_files_are_skipped_and_a_declared_class_may_have_no_folder(tmp_path):
    write_digits_images(tmp_path, 30)
    (tmp_path / "one" / ".DS_Store").write_bytes(b"\0\1")
    (tmp_path / ".cache").mkdir()
    table = load_images(tmp_path, classes=NAMES + ["eleven"], size=8, mode="L")
    assert table.n_classes == 11 and 10 not in set(table.labels.tolist())


def test_an_image_filed_under_two_classes_is_dropped(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        Image.new("L", (4, 4), 7).save(tmp_path / cls / "same.png")
        Image.new("L", (4, 4), 50 if cls == "a" else 90).save(tmp_path / cls / "own.png")
    table = load_images(tmp_path, classes=["a", "b"], size=4, mode="L")
    assert sorted(table.labels.tolist()) == [0, 1] and 7.0 not in table.features


@pytest.mark.parametrize("arrange, message", [
    (lambda r: (r / "ten").mkdir(), r"^data.source.classes: folder 'ten' in .* is not a declared class"),
    (lambda r: (r / "notes.txt").write_text("x"), r"^data.source.path: .* holds files outside class folders \(first: 'notes.txt'\)"),
    (lambda r: (r / "one" / "labels.csv").write_text("x"), r"^data.source.path: one/labels.csv is not an image file"),
    (lambda r: (r / "one" / "broken.png").write_bytes(b"not a png"),
     r"^data.source.path: 1 files under .* are not readable images \(first: one/broken.png\)$"),
])
def test_a_bad_folder_is_one_line(tmp_path, arrange, message):
    write_digits_images(tmp_path, 30)
    arrange(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_images(tmp_path, classes=NAMES, size=8, mode="L")


def test_a_missing_or_empty_folder_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="^data.source.path: .*nowhere is not a folder"):
        load_images(tmp_path / "nowhere", classes=["a", "b"], size=8, mode="L")
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="^data.source.path: no images in the class folders"):
        load_images(tmp_path, classes=["a", "b"], size=8, mode="L")


def _spec(tmp_path, folder="digits", **source):
    d = {"name": "images", "seed": 0,
         "data": {"declared_private_rows": 1000, "source": {"kind": "images", "path": folder, "classes": NAMES, "size": 8, **source},
                  "split": {"kind": "hashed", "public": 0.04, "test": 0.2}},
         "model": {"kind": "cnn", "channels": [8]},
         "estimator": {"kind": "two_point", "queries": 2},
         "mechanism": {"kind": "gaussian", "clip": 0.5},
         "privacy": {"epsilon": 3.0},
         "sampling": {"kind": "poisson", "expected_batch_size": 64},
         "optimizer": {"kind": "sgd", "lr": 0.1, "epochs": 20},
         "execution": {"backend": "local"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(d))
    return specs.load_spec(tmp_path / "spec.yaml")


def test_a_cnn_learns_digits_from_an_image_folder_named_relative_to_its_spec(tmp_path):
    write_digits_images(tmp_path / "digits")
    spec = _spec(tmp_path)
    d = spec.model_dump(mode="json")
    d["estimator"], d["optimizer"]["lr"] = {"kind": "first_order"}, 0.5  # DP-SGD: a few seconds on 2 cores
    spec = specs.spec_from_dict(d)
    assert spec.data.source.path == str(tmp_path / "digits") and spec.data.source.name == "digits"
    data = builders.load_data(spec)
    assert data.layout == "images:L:8;classes=by-name"
    assert float(data.private.features.max()) <= 240 / 255 + 1e-6  # fixed scale: /255, no image looked at
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    built = builders.build_loop(resolved, data, noise_generator=private_generator(0),
                                sampling_generator=private_generator(1))
    assert isinstance(built.model[0], torch.nn.Unflatten) and built.model[1].in_channels == 1
    built.loop.run(resolved.optimizer.steps)
    accuracy = models.evaluate(built.model, torch.as_tensor(data.test.features), torch.as_tensor(data.test.labels))
    assert accuracy["accuracy"] > 0.5  # chance is 0.1


def test_colour_images_build_a_three_channel_cnn(tmp_path):
    for cls in NAMES[:2]:
        (tmp_path / "rgb" / cls).mkdir(parents=True)
        for k in range(40):
            Image.new("RGB", (10, 10), (k * 6, 255 - k * 6, 100 if cls == "zero" else 20)).save(
                tmp_path / "rgb" / cls / f"{k}.png")
    d = _spec(tmp_path, "rgb", mode="RGB", size=6).model_dump(mode="json")
    d["data"]["source"]["classes"] = NAMES[:2]
    spec = specs.spec_from_dict(d)
    data = builders.load_data(spec)
    model = builders.build_model(spec, data.n_features, data.n_classes)
    assert data.n_features == 3 * 6 * 6 and model[1].in_channels == 3
    assert model(torch.as_tensor(data.test.features)).shape == (len(data.test.labels), 2)


@pytest.mark.parametrize("change, message", [
    ({"classes": ["a", "a"]}, "classes must be distinct"),
    ({"classes": ["a", "x/y"]}, "'x/y' is not a folder name"),
    ({"size": 2}, "data.source.size"),
    ({"mode": "CMYK"}, "data.source.mode"),
])
def test_bad_image_settings_name_the_field(tiny_spec_dict, change, message):
    tiny_spec_dict["data"]["source"] = {"kind": "images", "path": "/data/x", "classes": ["a", "b"], **change}
    with pytest.raises(specs.SpecError, match=message):
        specs.spec_from_dict(tiny_spec_dict)


def test_images_cross_checks(tiny_spec_dict):
    tiny_spec_dict["data"]["source"] = {"kind": "images", "path": "/data/x", "classes": ["a", "b"]}
    tiny_spec_dict["data"]["split"] = {"kind": "source", "public_source": {"kind": "images", "path": "/data/p",
                                                                           "classes": ["a", "b"], "size": 32}}
    with pytest.raises(specs.SpecError, match="public_source: images need public images of the same classes"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["data"]["split"] = {"kind": "column", "column": "consented"}
    with pytest.raises(specs.SpecError, match="data.split.kind: column reads a column of a file or sql source"):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["data"]["split"] = {"kind": "hashed", "public": 0.0}
    tiny_spec_dict["data"]["source"]["scale"] = "fixed"  # the pixel range is known: no public rows needed
    assert specs.spec_from_dict(tiny_spec_dict).data.source.image_shape == (1, 28, 28)


def test_reordering_or_extending_the_classes_keeps_every_images_identity(tmp_path):
    """A row's identity holds its class's name: the ledger matches it, and a hashed split keeps it in its
    part, whatever order the classes are declared in."""
    from components.data import hashed_split

    write_digits_images(tmp_path, 300)
    a = load_images(tmp_path, classes=NAMES, size=8, mode="L")
    b = load_images(tmp_path, classes=NAMES[::-1] + ["ten"], size=8, mode="L")
    assert set(a.row_fingerprints()) == set(b.row_fingerprints()) and a.layout == b.layout
    split_a = hashed_split(a, public=0.1, test=0.2, imbalance=None, seed=0, scale="none")
    split_b = hashed_split(b, public=0.1, test=0.2, imbalance=None, seed=0, scale="none")
    assert set(split_a.private.fingerprints) == set(split_b.private.fingerprints)


def test_sixteen_bit_grey_images_are_scaled_not_clipped(tmp_path):
    ramp = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1040)  # 0 .. 65520
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        Image.fromarray(ramp).save(tmp_path / cls / "deep.png")  # uint16: mode I;16
        Image.fromarray((ramp // 257).astype(np.uint8)).save(tmp_path / cls / "shallow.png")
        ramp = ramp[::-1].copy()
    table = load_images(tmp_path, classes=["a", "b"], size=8, mode="L")
    deep = table.features.reshape(-1, 8, 8)
    assert len(np.unique(deep)) > 60 and float(deep.max()) == pytest.approx(65520 / 257, abs=1e-3)
    rgb = load_images(tmp_path, classes=["a", "b"], size=8, mode="RGB")
    assert rgb.features.shape[1] == 3 * 64


def test_symlinked_folders_are_read_and_broken_links_refused(tmp_path):
    write_digits_images(tmp_path / "root", 40)
    more = tmp_path / "elsewhere"
    more.mkdir()
    Image.new("L", (8, 8), 99).save(more / "linked.png")
    (tmp_path / "root" / "one" / "batch2").symlink_to(more, target_is_directory=True)
    (tmp_path / "root" / "one" / "loop").symlink_to(tmp_path / "root" / "one", target_is_directory=True)
    table = load_images(tmp_path / "root", classes=NAMES, size=8, mode="L")
    assert any(float(row.max()) == 99.0 and float(row.min()) == 99.0 for row in table.features)
    (tmp_path / "root" / "two" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(ValueError, match=r"^data.source.path: 1 files under .* are not readable images \(first: two/gone.png\)"):
        load_images(tmp_path / "root", classes=NAMES, size=8, mode="L")


def test_oversized_and_deep_float_images_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    Image.new("L", (64, 64), 3).save(tmp_path / "a" / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64 x 64 is over twice the limit: a bomb
    with pytest.raises(ValueError, match=r"^data.source.path: a/big.png is too large to decode"):
        load_images(tmp_path, classes=["a", "b"], size=8, mode="L")
    monkeypatch.undo()
    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(tmp_path / "b" / "float.tif")
    with pytest.raises(ValueError, match=r"^data.source.path: b/float.tif has 32-bit float pixels"):
        load_images(tmp_path, classes=["a", "b"], size=8, mode="L")
