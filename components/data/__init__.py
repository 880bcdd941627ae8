"""Data sources, public/private/test splits and private samplers."""
from components.data.images import load_images
from components.data.packaged import load_packaged_images
from components.data.sampling import FixedSizeSampler, FullBatchSampler, PoissonSampler, build_sampler
from components.data.sources import Table, load_file, load_sklearn
from components.data.split import SplitData, column_split, fraction_split, hashed_split, source_split
from components.data.text import load_text

__all__ = ["FixedSizeSampler", "FullBatchSampler", "PoissonSampler", "SplitData", "Table", "build_sampler",
           "column_split", "fraction_split", "hashed_split", "load_file",
           "load_images", "load_packaged_images", "load_sklearn", "load_text", "source_split"]
