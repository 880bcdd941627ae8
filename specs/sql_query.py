"""data.source.query admitted only as a per-row filter of one table (docs/design.md, "Blocks"; the data guide's
"A query").

A guarantee is over persons: adding or removing one person may change that person's rows and nothing else.
A query is therefore admitted only when each of its output rows is a function of one row of one table (or
view), and whether that row is in the output depends on that row's own values: columns and per-row
expressions of the table, and a WHERE over them. Everything through which another row, the row order or
chance could decide a row is refused, each in one line naming what was found: aggregates and GROUP BY (a row
standing for several persons), DISTINCT, window functions, subqueries, a second table or a CTE (another
row's values deciding this one's), ORDER BY with LIMIT/OFFSET/FETCH or TABLESAMPLE (the other rows deciding
whether this one is read), set operations, and functions that are not a deterministic function of their
arguments (random(), now()). The check is an allow-list of expression kinds: what it does not know is
refused, never passed.

The parse is sqlglot's, in the database's own dialect."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

RULE = ("a query is a per-row filter: columns and per-row expressions of one table or view, with a WHERE on each "
        "row's own columns, since one person's rows may decide only their own rows")

DIALECTS = {"postgresql": "postgres", "sqlite": "sqlite"}


@dataclass(frozen=True)
class PerRowQuery:
    """What a query admitted as a per-row filter reads: its table (``schema.table`` as written), and each named
    output column's source column in it where the output is that column itself (None for an expression).
    ``star``: the query selects every column of the table (``*``), in the table's order, before the named ones."""

    table: str
    columns: Tuple[Tuple[str, Optional[str]], ...]
    star: bool

    def source_column(self, name: str) -> Optional[str]:
        """The table's column an output column is (``star``: every column of the table is itself)."""
        named: Dict[str, Optional[str]] = dict(self.columns)
        if name in named:
            return named[name]
        return name if self.star else None


def _names():
    from sqlglot import exp

    structure = (exp.Select, exp.From, exp.Table, exp.TableAlias, exp.Where, exp.Identifier, exp.Alias, exp.Star,
                 exp.Column, exp.Paren, exp.Literal, exp.Null, exp.Boolean, exp.DataType, exp.DataTypeParam, exp.Tuple)
    operators = (exp.And, exp.Or, exp.Not, exp.Xor, exp.Neg, exp.BitwiseNot, exp.BitwiseAnd, exp.BitwiseOr,
                 exp.BitwiseXor, exp.BitwiseLeftShift, exp.BitwiseRightShift, exp.Add, exp.Sub, exp.Mul, exp.Div,
                 exp.Mod, exp.IntDiv, exp.DPipe, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                 exp.NullSafeNEQ, exp.Is, exp.In, exp.Between, exp.Like, exp.ILike, exp.Glob, exp.RegexpLike,
                 exp.RegexpILike, exp.SimilarTo, exp.Escape, exp.Case, exp.If, exp.Cast, exp.TryCast)
    # deterministic functions of their arguments alone
    functions = (exp.Coalesce, exp.Nullif, exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Sqrt, exp.Ln, exp.Log,
                 exp.Exp, exp.Pow, exp.Sign, exp.Greatest, exp.Least, exp.Lower, exp.Upper, exp.Length,
                 exp.Substring, exp.Trim, exp.Concat, exp.ConcatWs, exp.StrPosition, exp.Replace, exp.Left,
                 exp.Right, exp.Trunc if hasattr(exp, "Trunc") else exp.Floor)
    return structure + operators + functions


_REFUSED_WORDS = (
    ("AggFunc", "an aggregate"), ("Window", "a window function (OVER)"), ("Group", "GROUP BY"), ("Having", "HAVING"),
    ("Distinct", "DISTINCT"), ("Order", "ORDER BY"), ("Limit", "LIMIT"), ("Offset", "OFFSET"), ("Fetch", "FETCH"),
    ("TableSample", "TABLESAMPLE"), ("Subquery", "a subquery"), ("Exists", "a subquery (EXISTS)"),
    ("Join", "a second table (a join)"), ("With", "a WITH clause"), ("CTE", "a WITH clause"),
    ("Union", "a set operation (UNION)"), ("Intersect", "a set operation (INTERSECT)"),
    ("Except", "a set operation (EXCEPT)"), ("Rand", "random()"), ("Lateral", "LATERAL"),
    ("CurrentTimestamp", "the current time"), ("CurrentDate", "the current date"), ("CurrentTime", "the current time"),
)


def _found(node) -> str:
    """What a refused node is, in SQL words."""
    from sqlglot import exp

    for name, words in _REFUSED_WORDS:
        kind = getattr(exp, name, None)
        if kind is not None and isinstance(node, kind):
            return words
    if isinstance(node, exp.Func):
        return f"the function {node.sql_name() if not isinstance(node, exp.Anonymous) else node.name}()"
    return f"{type(node).__name__} ({node.sql()[:40]})"


def refusal(found: str) -> str:
    return f"{found} is not admitted; {RULE}"


def per_row_query(text: str, backend: str) -> PerRowQuery:
    """``text`` parsed in ``backend``'s dialect (a SQLAlchemy backend name: postgresql, sqlite) and admitted as a
    per-row filter; ValueError naming the first thing that is not (the caller prefixes its field)."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError

    dialect = DIALECTS.get(backend)
    if dialect is None:
        raise ValueError(f"a query on {backend!r} cannot be checked (PostgreSQL and SQLite can); name a table or view")
    try:
        statements = [s for s in sqlglot.parse(text, read=dialect) if s is not None]
    except ParseError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "a parse error"
        raise ValueError(f"it does not parse as {backend} SQL ({first})") from None
    if len(statements) != 1:
        raise ValueError(f"it holds {len(statements)} statements; give one SELECT: {RULE}")
    select = statements[0]
    if isinstance(select, (exp.Union, exp.Intersect, exp.Except)):
        raise ValueError(refusal(_found(select)))
    if not isinstance(select, exp.Select):
        raise ValueError(f"it is not a SELECT ({select.sql()[:40]!r}); {RULE}")
    allowed = _names()
    for node in select.walk():
        if not isinstance(node, allowed) or (isinstance(node, exp.Func) and not isinstance(node, allowed)):
            raise ValueError(refusal(_found(node)))
        if isinstance(node, exp.Select) and node is not select:
            raise ValueError(refusal("a subquery"))
    source = select.args.get("from_") or select.args.get("from")
    tables = list(select.find_all(exp.Table))
    if source is None or len(tables) != 1 or not isinstance(source.this, exp.Table):
        raise ValueError(refusal("a query without one table in FROM" if not tables else "a second table"))
    table = tables[0]
    if not isinstance(table.this, exp.Identifier) or table.args.get("catalog"):
        raise ValueError(refusal(f"FROM {table.sql()}"))
    names = {table.name, table.alias_or_name}
    if table.args.get("db"):
        names.add(f"{table.db}.{table.name}")
    for column in select.find_all(exp.Column):
        if column.table and column.table not in names:
            raise ValueError(refusal(f"column {column.sql()} of another table"))
    if select.args.get("where") is not None and any(isinstance(n, exp.Star) for n in select.args["where"].walk()):
        raise ValueError(refusal("* in WHERE"))
    star, columns = False, []
    for item in select.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            star = True
            continue
        name = item.alias_or_name
        if not name:
            raise ValueError(f"its output column {item.sql()!r} has no name; name it with AS")
        inner = item.this if isinstance(item, exp.Alias) else item
        columns.append((name, inner.name if isinstance(inner, exp.Column) else None))
    qualified = f"{table.db}.{table.name}" if table.args.get("db") else table.name
    return PerRowQuery(qualified, tuple(columns), star)
