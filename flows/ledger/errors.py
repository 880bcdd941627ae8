"""The ledger's refusals, each one line that says what to change, and how a ledger's URL and its driver's
errors are shown in them."""
from __future__ import annotations

from typing import Optional

from flows.ledger.schema import WHOLE
from specs.refusal import RuntimeRefusal

# the end of every refusal for terms other than the registered ones
FIXED = ("a dataset's terms are fixed when it is registered: keep them (its rows under another budget.dataset "
         "are refused: a new dataset is for other people's rows)")


class BudgetExceeded(RuntimeRefusal):
    """The run would take a block of the dataset past its lifetime epsilon; nothing was reserved.

    ``would_reach``: the block's composed epsilon with this run; ``fits``: the largest epsilon a run of the
    same shape (more noise, same steps and sampling) can have and still compose within the lifetime, None if
    none can; ``next_block``: the block whose arrival brings budget, None if no arrival can."""

    def __init__(self, dataset: str, remaining: float, requested: float, lifetime: float, *, block: str = WHOLE,
                 would_reach: Optional[float] = None, fits: Optional[float] = None, charges: int = 0,
                 next_block: Optional[str] = None, when: Optional[str] = None):
        self.dataset, self.remaining, self.requested, self.lifetime = dataset, remaining, requested, lifetime
        self.block, self.would_reach, self.fits, self.next_block = block, would_reach, fits, next_block
        where = f"dataset {dataset!r}" if block == WHOLE else f"block {block!r} of dataset {dataset!r}"
        reach = "" if would_reach is None else (
            f": composed with the {charges} charge{'s' if charges != 1 else ''} before it, it would reach "
            f"{would_reach:.4g} of the lifetime {lifetime:.4g}")
        fit = (f"a run of epsilon <= {fits:.4g} still fits (lower privacy.epsilon)" if fits is not None
               else "no run fits any more")
        if when is not None:
            pass
        elif next_block is not None:
            when = f"block {next_block!r} brings budget of its own when it arrives"
        elif block == WHOLE:
            when = ("new rows bring no budget to a dataset charged as one block (data.blocks with budget.window "
                    "gives each period's rows a budget of their own)")
        else:
            when = "no block that the window can still choose has budget left"
        super().__init__(f"budget.lifetime_epsilon: {where} cannot take this run of epsilon {requested:.4g}{reach}; "
                         f"{fit}; {when}")


class RowsExposed(RuntimeRefusal):
    """The run would use rows as public or test data that earlier runs on the dataset, or on ``other``
    dataset of the ledger, kept private."""

    def __init__(self, dataset: str, n_rows: int, other: Optional[str] = None):
        self.dataset, self.n_rows, self.other = dataset, n_rows, other
        if other is not None:
            super().__init__(
                f"data.split: {n_rows} public or test rows of this run are private rows of dataset {other!r} in "
                f"this ledger and cannot be used without noise under {dataset!r}; leave them out of this run's "
                "public and test rows (data.split), or train on them privately under their own budget.dataset "
                f"{other!r}")
            return
        super().__init__(
            f"data.split: {n_rows} public or test rows of this run were private in earlier runs on dataset "
            f"{dataset!r} and cannot be used without noise now; keep the seed and data.split of those runs "
            "(data that grows between runs needs data.split.kind hashed, column or source from its first run)")


class RowsUnmatched(RuntimeRefusal):
    """The run identifies rows differently from earlier runs on the dataset, so they cannot be matched."""

    def __init__(self, dataset: str, recorded: str, now: str, reason: Optional[str] = None):
        self.dataset, self.recorded, self.now = dataset, recorded, now
        if reason is None and identity_of(recorded) != identity_of(now):
            reason = identity_changed(dataset, recorded, now)
        # never "charge a new dataset": the same rows under a second name would be the same people's second lifetime
        super().__init__(reason or (
            f"data.source: this run identifies rows differently from earlier runs on dataset {dataset!r} "
            f"({_layout_change(recorded, now)}), so the ledger cannot tell which rows they kept private; keep "
            "the source's columns and text settings of those runs (rows named by data.source.row_id keep their "
            "identity whatever their columns)"))


class BlockRecordChanged(RuntimeRefusal):
    """A block's stored composition is not what its committed charges compose to: admission reads the stored
    one, so a run is refused until the ledger's owner has looked (``privzo budget show DATASET --check``)."""

    def __init__(self, dataset: str, block: str, stored: float, recomposed: float, n: int):
        self.dataset, self.block = dataset, block
        super().__init__(
            f"ledger: block {block!r} of dataset {dataset!r} stores epsilon {stored:.6g}, but its {n} committed "
            f"charge{'s' if n != 1 else ''} compose to {recomposed:.6g}: its record was changed outside privzo, so "
            f"no run is admitted on it; its owner checks it with `privzo budget show {dataset} --check`")


def identity_of(layout: str, types: bool = True) -> str:
    """What a row layout identifies rows and persons by, in words (``types``: with the identity columns a
    database keeps as integers)."""
    parts = dict(p.partition("=")[::2] for p in layout.partition(":")[2].split(";") if p)
    what = f"row id column {parts['row_id']!r}" if "row_id" in parts else "their content (features and label)"
    typed = parts.get("integer-ids") if types else None
    return what + (f", {typed.replace(',', ' and ')} read as integers" if typed else "")


def identity_changed(dataset: str, recorded: str, now: str) -> str:
    return (f"data.source: dataset {dataset!r}'s runs identified its rows by {identity_of(recorded)}; this run "
            f"identifies them by {identity_of(now)}, under which the same people would be new to the ledger; if they "
            f"are the same people, the ledger's owner re-keys the dataset once with `privzo budget migrate-ids "
            f"{dataset} --spec SPEC` (their records and blocks carry over), else keep the identity of those runs")


def identity_types_not_recorded(dataset: str) -> "RowsUnmatched":
    """A dataset recorded before the types of its identity columns were terms of its row layout."""
    return RowsUnmatched(dataset, "", "", reason=(
        f"data.source: dataset {dataset!r}'s ledger was written before privzo recorded the types of its identity "
        f"columns; its owner records them once with `privzo budget migrate-ids {dataset} --spec SPEC` (nothing is "
        "re-keyed), after which a change of type is refused"))


def ids_not_migrated(dataset: str) -> "RowsUnmatched":
    """A dataset whose ledger holds person and row ids an earlier privzo read with type inference."""
    return RowsUnmatched(dataset, "", "", reason=(
        f"data.source: dataset {dataset!r}'s ledger holds person and row ids read by an earlier privzo with type "
        "inference (an id written 0065 recorded as 65), and runs now read them as written; migrate it once with "
        f"`privzo budget migrate-ids {dataset} --spec SPEC` (the ledger owner's, on data holding every person and "
        "row earlier runs recorded)"))


class RowsLaundered(RuntimeRefusal):
    """Rows this run would keep private are private rows of another dataset: the same people charged under a
    second name would have a second budget."""

    def __init__(self, dataset: str, other: str, n_rows: int, persons: bool = False):
        what = "persons of this run (data.blocks.person) are persons" if persons else \
            "private rows of this run are private rows"
        super().__init__(f"budget.dataset: {n_rows} {what} of dataset {other!r} in this ledger; the same people "
                         f"cannot have a second budget under {dataset!r}: charge them to {other!r}")
        self.dataset, self.other = dataset, other


class RowsUnrecognised(RowsUnmatched):
    """Same layout, but not one of the run's rows is a row earlier runs kept private: the rows were
    re-encoded (a label or a value written another way gives every row a new fingerprint) or replaced.
    Either way the ledger cannot tell which of them were private before, and a re-encoded private row
    could land in the public or test split unrecognised."""

    def __init__(self, dataset: str, n_known: int, block: Optional[str] = None):
        known = (f"the {n_known} rows earlier runs on dataset {dataset!r} kept private" if block is None else
                 f"the {n_known} rows earlier runs on dataset {dataset!r} recorded in it")
        RuntimeError.__init__(
            self, f"data.source: none of this run's rows{'' if block is None else f' in block {block!r}'} matches "
            f"{known}; if they are the same people's rows, write them as those runs read them "
            "(labels, values and columns unchanged) and under the same PRIVZO_FINGERPRINT_KEY; if they are new "
            "people, charge a new budget.dataset")
        self.dataset, self.recorded, self.now, self.block = dataset, "", "", block


class LedgerUnavailable(RuntimeRefusal):
    """The ledger cannot be signed into or written with the caller's credentials: a run that would spend a
    dataset's budget is refused before any row is read, with nothing charged."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"budget.ledger: cannot spend budget through {where} ({reason}); a run that spends a "
                         "dataset's budget needs the ledger's own credentials (budget.ledger, or "
                         "$PRIVZO_LEDGER_URL); nothing was read or charged")


class LedgerOutage(RuntimeRefusal):
    """The ledger's server did not answer within the wait (flows/ledger/outages.py): the call wrote nothing, and
    a run's reservation is kept by its lease, so the next run settles it at what the run may have spent."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"budget.ledger: the ledger at {where} did not answer ({reason}); a reservation this "
                         "run holds is settled at its recorded bound once its lease runs out (privzo budget show)")


class DatasetNotRegistered(LedgerUnavailable):
    """A run would charge a dataset the ledger has not registered, and its role may not register one: a
    dataset's lifetime is set by the ledger's owner, never by whoever runs a spec."""

    def __init__(self, dataset: str, where: str, what: str = "is not registered"):
        RuntimeError.__init__(
            self, f"budget.dataset: {dataset!r} {what} in the ledger {where}, and this role may not "
            "register it (a dataset's terms are set by the ledger's owner: privzo budget init "
            f"{dataset} --spec SPEC --ledger OWNER_URL); nothing was read or charged")


def shown_url(url: Optional[str]) -> str:
    """A database URL as it may be shown: its password as ***, since a team ledger's URL holds one."""
    if not url:
        return "(none)"
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for display
        return url


def driver_reason(err: BaseException) -> str:
    """The database driver's own last line of an error (not SQLAlchemy's page of context)."""
    reason = str(getattr(err, "orig", None) or err).strip().splitlines()
    return reason[-1] if reason else type(err).__name__


def _layout_change(recorded: str, now: str) -> str:
    """The first difference between two row layouts ('source:key=value;...'), in words."""
    def parts(layout: str) -> dict:
        head, _, rest = layout.partition(":")
        return {"source": head, **dict(p.partition("=")[::2] for p in rest.split(";") if p)}

    a, b = parts(recorded), parts(now)
    for key in list(a) + [k for k in b if k not in a]:
        if a.get(key) == b.get(key):
            continue
        old, new = (a.get(key) or "").split(","), (b.get(key) or "").split(",")
        if key == "features" and a.get(key) and b.get(key):
            added, removed = [c for c in new if c not in old], [c for c in old if c not in new]
            return f"feature {added[0]!r} added" if added else f"feature {removed[0]!r} removed"
        return f"{key} {a.get(key, 'unset')!r} before, {b.get(key, 'unset')!r} now"
    return "layout changed"
