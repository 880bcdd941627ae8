"""The privacy ledger: what every run has spent on each dataset, and refusal to overspend.

One row per run: dataset id and content fingerprint, the planned and the executed DpEvent (JSON),
status (reserved / committed / aborted) and steps run. A dataset's total is the exact composition of its
runs' events with dp-accounting (never a sum of epsilons): committed runs count with what they executed,
reserved runs with what they planned.

The ledger also keeps the content fingerprint of every row any run on a dataset treated as private, and
refuses a run that would use one of them as public or test data (both are used without noise), whichever
dataset of the ledger kept it private: a seed or split change between runs, new rows that move the split,
or another dataset name whose split marks those rows public, would otherwise expose people whose privacy
earlier runs have already spent. Rows private under one dataset are refused as private rows of another
(laundering), and with a person column (data.blocks.person) so are persons, matched on their keyed id.

Reservation is one transaction holding the dataset's lock (SQLite: ``BEGIN IMMEDIATE``, which locks the whole
file; PostgreSQL: an advisory lock on the dataset's name, and, since its row checks read other datasets'
rows, a ledger-wide one before them), so concurrent runs cannot both fit into the same remaining budget, nor
two datasets' first runs both claim the same rows.

A dataset's terms are fixed when it is registered (``DatasetTerms``): its lifetime epsilon and delta, the
accountant and neighbouring relation, and whether it has blocks, their period, its person column and the
persons or rows declared per block. A run whose spec differs in any of them is refused before any row is
read and again inside its reservation: dropping the window or the person column would otherwise give the
same rows a second lifetime. The terms are its owner's to
set. On PostgreSQL the ledger has roles (``grant``): the owner of its tables registers datasets
(``register``, ``privzo budget init``); a worker may read everything and charge registered datasets
(insert charges and blocks, move a charge from reserved to committed or aborted, fold it into its blocks)
but may not register or change a dataset, delete any row, or give a block other terms than its dataset's
(a foreign key ties every block to its dataset's lifetime and delta); a viewer only reads. A run whose role
may not register an unregistered dataset is refused before any row is read. A SQLite ledger is one
person's: whoever may write the file is its owner, and a dataset's first run registers it. A dataset
registered before the terms beyond its lifetime were kept adopts those of its next run (one the owner
runs, or its owner's ``privzo budget init --spec``), once, if they agree with the blocks, persons and rows
the ledger already holds for it.

Budgets belong to blocks of the dataset (docs/design.md, "Blocks"): a charge is recorded on every block
its run read, each block keeps the exact composition of its committed charges as a stored accountant
state (``ComposedState``), and a reservation composes the run's planned event onto that state and the
block's open reservations, so its cost does not grow with the block's history. A dataset's guarantee is
the maximum over its blocks. A dataset charged before blocks existed is one block, ``all``, made from its
charges the first time a reservation or commit touches it. Admission is a privacy filter (``admission``'s
note says which, per accountant).

The modules, one job each:

- ``schema``: the tables, the charge states, and what a worker role may write (``WORKER_GRANTS``);
- ``errors``: every refusal (``BudgetExceeded``, ``RowsExposed``, ``LedgerUnavailable``, ...) and how a
  ledger's URL and its driver's errors are shown in them;
- ``terms``: ``DatasetTerms`` and ``BlockTerms``; ``reservation``: ``Reservation`` (the terms and the run's claim: ``RowsRead``, ``WindowRead``), what ``reserve`` takes;
- ``admission``: pure decisions, no database: terms compared, whether a block has room, the largest run
  that still fits, whether a run recognises the rows earlier runs recorded;
- ``rows``: the checks and records of private rows and persons across the ledger's datasets;
- ``outages``: every ledger call retried whole across a PostgreSQL server's restart or stop, up to a wait;
- ``migrations``: making the tables and migrating a ledger an earlier privzo made; ``roles``: PostgreSQL
  grants and what a connection may write;
- ``core``: ``PrivacyLedger`` (``PrivacyLedger.open(url)``: the process's one ledger per URL, shared by a
  run's steps), ``Block``, ``Charge``, ``ledger_for_spending``; ``budget``: ``Budget``, the handle a run
  opens once at its entry and hands to every step that reads or charges its budget;
- ``integrity``: the rules PostgreSQL holds every role to (triggers), and the recomposition check of a
  block's stored composition against its charges.
"""
from flows.ledger.budget import Budget
from flows.ledger.core import Block, Charge, PrivacyLedger, ledger_for_spending
from flows.ledger.errors import (FIXED, BudgetExceeded, DatasetNotRegistered, LedgerOutage, LedgerUnavailable,
                                 RowsExposed, RowsLaundered, RowsUnmatched, RowsUnrecognised, driver_reason, shown_url)
from flows.ledger.integrity import ledger_problems, recomposition_problems
from flows.ledger.reservation import Reservation, RowsRead, WindowRead
from flows.ledger.schema import (ABORTED, COMMITTED, NO_BLOCKS, RESERVED, TERM_COLUMNS, WHOLE, WORKER_GRANTS, BlockRow,
                                 ChargeBlockRow, ChargeRow, DatasetRow, PrivateRowRow, RowBlockRow, RowLayoutRow)
from flows.ledger.terms import BlockTerms, DatasetTerms

__all__ = [
    "ABORTED", "COMMITTED", "FIXED", "NO_BLOCKS", "RESERVED", "TERM_COLUMNS", "WHOLE", "WORKER_GRANTS",
    "Block", "BlockRow", "BlockTerms", "Budget", "BudgetExceeded", "Charge", "ChargeBlockRow", "ChargeRow",
    "DatasetNotRegistered", "DatasetRow", "DatasetTerms", "LedgerOutage", "LedgerUnavailable", "PrivacyLedger", "PrivateRowRow",
    "Reservation", "RowBlockRow", "RowLayoutRow", "RowsRead", "RowsExposed", "RowsLaundered", "RowsUnmatched",
    "RowsUnrecognised", "WindowRead", "driver_reason", "ledger_for_spending", "ledger_problems", "recomposition_problems", "shown_url",
]
