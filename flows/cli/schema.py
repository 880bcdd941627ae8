"""``privzo schema``: the JSON Schema of RunSpec, for editors."""
from __future__ import annotations

import specs


def add_parser(sub) -> None:
    p = sub.add_parser("schema", help="JSON Schema of RunSpec (for editors)")
    p.set_defaults(func=command)


def command(_args) -> int:
    print(specs.json_schema())
    return 0
