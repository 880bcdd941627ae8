"""The ``budget`` section: a dataset's lifetime privacy budget, and the ledger that keeps it across runs."""
from __future__ import annotations

import datetime as dt
import os
from typing import Optional

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from specs.base import Strict


DATASET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"

# Where a spec names no ledger, the environment does (as MLFLOW_TRACKING_URI names the tracking store):
# a team's workers point every run at the shared ledger (infra/compose) without each spec naming it. The
# resolved spec, which is what gets logged, holds the value used.
LEDGER_URL_ENV = "PRIVZO_LEDGER_URL"


def ledger_from_env() -> str:
    return os.environ.get(LEDGER_URL_ENV, "").strip() or default_ledger()


class WindowSpec(Strict):
    """Which blocks a run reads, from public facts only (the run's scheduled time, the calendar, the spec and
    the ledger's charges): ``last``, the ``blocks`` most recent periods that ended before it; ``with_budget``,
    the ``blocks`` most recent periods since ``since`` that still have room for the run, passing over those
    whose budget is spent. Rows of other blocks are not used at all."""

    kind: Literal["last", "with_budget"] = Field("last", description="last: the last `blocks` sealed periods, "
                                                 "the run refused if one has no room; with_budget: the newest "
                                                 "`blocks` sealed periods since `since` with room for the run.")
    blocks: PositiveInt = Field(..., description="How many sealed periods the run reads (e.g. 7 days); with "
                                "with_budget, at most this many (N is declared for this many).")
    since: Optional[dt.date] = Field(None, description="with_budget: the first period of the stream (a date "
                                     "in it); periods before it are never read.")

    @field_validator("since", mode="before")
    @classmethod
    def _a_date(cls, value):
        if isinstance(value, str):  # YAML reads an unquoted 2026-09-01 as a date; JSON and quotes give text
            try:
                return dt.date.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a date (e.g. 2026-09-01)") from None
        return value

    @model_validator(mode="after")
    def _since_with_budget(self):
        if (self.kind == "with_budget") != (self.since is not None):
            raise ValueError("since: with_budget needs since (the stream's first day), last takes none"
                             if self.kind == "with_budget" else "since: only with kind with_budget")
        return self


class BudgetSpec(Strict):
    """Lifetime privacy budget of a dataset, kept in the privacy ledger across runs; with data.blocks, the
    lifetime of each block."""

    dataset: str = Field(..., pattern=DATASET_PATTERN,
                         description="Ledger id of the people whose data this is (shared by every run on it).")
    lifetime_epsilon: PositiveFloat = Field(..., description="The dataset's lifetime epsilon; with data.blocks, "
                                            "each block's.")
    window: Optional[WindowSpec] = Field(None, description="With data.blocks: the blocks a run reads.")
    ledger: str = Field(default_factory=ledger_from_env,
                        min_length=1,
                        description="SQLAlchemy URL (SQLite with an absolute path, PostgreSQL). Every run on one "
                        f"dataset must use one ledger. Default: ${LEDGER_URL_ENV}, else this user's "
                        "~/.privzo/privacy-ledger.db.")

    @field_validator("ledger")
    @classmethod
    def _one_ledger_wherever_privzo_runs(cls, value: str) -> str:
        problem = sqlite_ledger_problem(value)
        if problem:
            raise ValueError(f"{problem} (the spec's, else ${LEDGER_URL_ENV})")
        return value


def default_ledger() -> str:
    """This user's ledger, the same file from any working folder (the fingerprint key lives beside it)."""
    return f"sqlite:///{os.path.join(os.path.expanduser('~'), '.privzo', 'privacy-ledger.db')}"


def sqlite_ledger_problem(url: str) -> Optional[str]:
    """Why a SQLite ledger URL cannot keep a dataset's one ledger, or None. A relative path names another
    file from every folder privzo runs in (a Prefect worker's is not the user's): runs started from two
    folders would each see their own total and could together pass the lifetime budget. An in-memory
    database forgets every run when its process ends."""
    scheme, _, rest = url.partition("://")
    if not scheme.lower().startswith("sqlite"):
        return None
    path = rest[1:].split("?", 1)[0] if rest.startswith("/") else ""
    if path in ("", ":memory:") or "mode=memory" in rest:
        return "an in-memory SQLite ledger forgets every run when its process ends; give a file: sqlite:////ABSOLUTE/PATH.db"
    if not path.startswith("/"):
        return (f"a relative SQLite path names another ledger from every folder privzo runs in (runs from two "
                f"folders could together pass the lifetime); give an absolute path, as this folder's: "
                f"{scheme}:///{os.path.abspath(path)}")
    return None
