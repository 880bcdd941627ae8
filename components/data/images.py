"""A team's own images, one folder per class (torchvision's ImageFolder layout), decoded with Pillow."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Sequence, Union

import numpy as np

from components.data.table import Table, unique_rows
from components.registry import SOURCES

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def _image_files(folder: Path) -> List[Path]:
    """Every non-hidden file under ``folder``, symlinked folders followed (each real folder once, so a
    link loop ends), broken links included (they fail to open, and are reported), sorted by path."""
    files, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files += [Path(dirpath) / name for name in filenames if not name.startswith(".")]
    return sorted(files, key=lambda f: f.relative_to(folder).as_posix())


def _pixels(image, size: int, mode: str) -> np.ndarray:
    """[channels, size, size] float32 in 0-255. 16-bit grey is brought to that range (/257) before
    resizing; 32-bit integer or float pixels have no known range and are refused by the caller."""
    from PIL import Image

    if image.mode in SIXTEEN_BIT:
        grey = Image.fromarray(np.asarray(image, dtype=np.float32) / 257.0)  # float32: mode F
        plane = np.asarray(grey.resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)
        return np.repeat(plane[None], 1 if mode == "L" else 3, axis=0)
    pixels = np.asarray(image.convert(mode).resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)
    return pixels[None] if mode == "L" else np.moveaxis(pixels, -1, 0)


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
        for file in _image_files(folder):
            where = file.relative_to(root).as_posix()
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                raise ValueError(f"data.source.path: {where} is not an image file; allowed "
                                 f"suffixes: {', '.join(IMAGE_SUFFIXES)}")
            try:
                with Image.open(file) as image:
                    depth = image.mode
                    pixels = None if depth in ("I", "F") else _pixels(image, size, mode)
            except Image.DecompressionBombError:
                raise ValueError(f"data.source.path: {where} is too large to decode (over Pillow's limit of "
                                 f"{Image.MAX_IMAGE_PIXELS} pixels); shrink it first") from None
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
                unreadable.append(where)
                continue
            if pixels is None:
                raise ValueError(f"data.source.path: {where} has 32-bit {'float' if depth == 'F' else 'integer'} "
                                 "pixels, whose range is unknown; save it as an 8- or 16-bit image")
            rows.append(pixels)
            labels.append(label)
    if unreadable:
        raise ValueError(f"data.source.path: {len(unreadable)} files under {root} are not readable images "
                         f"(first: {unreadable[0]})")
    if not rows:
        raise ValueError(f"data.source.path: no images in the class folders of {root}")
    channels = 1 if mode == "L" else 3
    features = np.ascontiguousarray(np.stack(rows).reshape(len(rows), channels * size * size))
    return unique_rows(Table(root.name, features, np.asarray(labels, dtype=np.int64), len(classes), 1.0 / 255.0,
                              layout=f"images:{mode}:{size};classes=by-name", class_names=tuple(classes)))


@SOURCES.register("images")
def _images(source, model_tokenizer=None, public_flag=None):
    return load_images(source.path, classes=source.classes, size=source.size, mode=source.mode), source.scale
