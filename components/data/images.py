"""A team's own images, one folder per class (torchvision's ImageFolder layout), decoded with Pillow."""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Union

import numpy as np

from components.data.sources import Table, _unique_rows

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")


def load_images(path: Union[str, Path], *, classes: Sequence[str], size: int, mode: str) -> Table:
    """Every image under ``path/<class>/`` (subfolders included, hidden files skipped) as one row: converted
    to ``mode`` (L or RGB), resized to ``size`` x ``size`` (bilinear), pixels 0-255 as float32, channels
    first and flattened; the label is the class folder's position in ``classes``. Exact duplicate images
    are dropped, as for every source.

    ``classes`` comes from the spec: a subfolder that is not declared is an error (never a silent new
    class), and a declared class may have no folder (no rows)."""
    from PIL import Image, UnidentifiedImageError

    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"data.source.path: {root} is not a folder (expected one subfolder per class)")
    undeclared = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                        and p.name not in classes)
    if undeclared:
        raise ValueError(f"data.source.classes: folder {undeclared[0]!r} in {root} is not a declared class; "
                         f"declare it or move it out ({len(undeclared)} undeclared)")
    stray = sorted(p.name for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
    if stray:
        raise ValueError(f"data.source.path: {root} holds files outside class folders (first: {stray[0]!r}); "
                         "put every image in its class's folder")
    rows: List[np.ndarray] = []
    labels: List[int] = []
    unreadable: List[str] = []
    for label, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            continue
        files = sorted(f for f in folder.rglob("*") if f.is_file()
                       and not any(part.startswith(".") for part in f.relative_to(folder).parts))
        for file in files:
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                raise ValueError(f"data.source.path: {file.relative_to(root)} is not an image file; allowed "
                                 f"suffixes: {', '.join(IMAGE_SUFFIXES)}")
            try:
                with Image.open(file) as image:
                    pixels = np.asarray(image.convert(mode).resize((size, size), Image.Resampling.BILINEAR),
                                        dtype=np.float32)
            except (UnidentifiedImageError, OSError, ValueError):
                unreadable.append(str(file.relative_to(root)))
                continue
            rows.append(pixels[None] if mode == "L" else np.moveaxis(pixels, -1, 0))
            labels.append(label)
    if unreadable:
        raise ValueError(f"data.source.path: {len(unreadable)} files under {root} are not readable images "
                         f"(first: {unreadable[0]})")
    if not rows:
        raise ValueError(f"data.source.path: no images in the class folders of {root}")
    channels = 1 if mode == "L" else 3
    features = np.ascontiguousarray(np.stack(rows).reshape(len(rows), channels * size * size))
    return _unique_rows(Table(root.name, features, np.asarray(labels, dtype=np.int64), len(classes), 1.0 / 255.0,
                              layout=f"images:{mode}:{size}"))
