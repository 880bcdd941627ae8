"""Data sources, public/private/test splits and private samplers.

The names below load their module when first used: a light module of the package (``prompts``, which the
memory plan reads when `privzo validate` checks a language model's spec) is imported without the samplers'
accounting libraries or the file readers' pandas."""
import importlib

_HOMES = {
    "load_images": "images", "load_packaged_images": "packaged", "FixedSizeSampler": "sampling",
    "FullBatchSampler": "sampling", "PoissonSampler": "sampling", "build_sampler": "sampling", "Table": "sources",
    "load_file": "sources", "load_sklearn": "sources", "SplitData": "split", "column_split": "split",
    "fraction_split": "split", "hashed_split": "split", "source_split": "split", "load_text": "text",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
