"""Every kind the spec accepts has exactly one row of facts (specs/traits.py) and one registered builder
(components/registry.py), and the facts other code used to restate agree with the code that runs."""
from __future__ import annotations

import re

import pytest

import specs
from specs import traits


def _schema_kinds():
    """{field path: kinds} for every discriminated union of RunSpec's JSON schema, read from the schema."""
    schema = specs.RunSpec.model_json_schema()
    defs = schema["$defs"]

    def resolve(node):
        return defs[node["$ref"].split("/")[-1]] if "$ref" in node else node

    def union_kinds(node):
        node = resolve(node)
        options = node.get("oneOf") or node.get("anyOf") or [node]
        kinds = set()
        for option in options:
            option = resolve(option)
            kind = option.get("properties", {}).get("kind")
            if kind is not None:
                kinds.update([kind["const"]] if "const" in kind else kind.get("enum", []))
        return kinds

    data = resolve(schema["properties"]["data"])["properties"]
    return {"estimator": union_kinds(schema["properties"]["estimator"]),
            "mechanism": union_kinds(schema["properties"]["mechanism"]),
            "optimizer": union_kinds(schema["properties"]["optimizer"]),
            "sampling": union_kinds(schema["properties"]["sampling"]),
            "model": union_kinds(schema["properties"]["model"]),
            "data.source": union_kinds(data["source"]),
            "data.split": union_kinds(data["split"])}


SCHEMA = _schema_kinds()


def test_the_schema_reader_sees_every_section():
    assert sorted(SCHEMA) == sorted(traits.TABLES)
    assert all(SCHEMA.values()), SCHEMA


@pytest.mark.parametrize("section", sorted(traits.TABLES))
def test_every_kind_has_exactly_one_traits_row(section):
    assert set(traits.TABLES[section]) == SCHEMA[section]


@pytest.mark.parametrize("section", sorted(traits.TABLES))
def test_every_kind_has_exactly_one_builder(section):
    from components import builders  # noqa: F401 (imports every kind's module, which registers it)
    from components.registry import ALL

    assert ALL[section].kinds() == SCHEMA[section]


def test_a_second_builder_for_a_kind_is_refused():
    from components.registry import Registry

    registry = Registry("estimator", "(spec, dimension)", ())
    registry.register("two_point")(lambda spec, dimension: None)
    with pytest.raises(RuntimeError, match="two builders"):
        registry.register("two_point")(lambda spec, dimension: None)
    with pytest.raises(ValueError, match="estimator.kind: unknown 'x'; allowed: two_point"):
        registry["x"]


def test_families_agree_across_sections():
    for kind, row in traits.ESTIMATORS.items():
        assert row.family in traits.FAMILIES and row.release in (traits.SCALAR, traits.SELECTION, traits.DENSE), kind
    for kind, row in traits.MECHANISMS.items():
        assert set(row.families) <= set(traits.FAMILIES), kind
    assert {row.family for row in traits.OPTIMIZERS.values()} == set(traits.FAMILIES)
    assert set(traits.PROBLEMS.values()) <= {traits.NONSMOOTH, traits.KL}


def test_every_shipped_spec_keeps_one_family():
    """An example's estimator, optimizer and mechanism belong to one family (the rules refuse a mix)."""
    from tests.conftest import ROOT

    for path in sorted((ROOT / "specs").glob("*/*.yaml")):
        spec = specs.load_spec(path)
        family = traits.family_of(spec)
        assert traits.ESTIMATORS[spec.estimator.kind].family == family, path.name
        assert family in traits.MECHANISMS[spec.mechanism.kind].families, path.name


@pytest.mark.parametrize("where", [
    {"kind": "file", "path": "rows.csv"},
    {"kind": "sql", "url": "sqlite:///rows.db", "table": "visits"},
])
@pytest.mark.parametrize("columns, message", [
    ({"classes": [0, 1, 1]}, "classes must be distinct"),
    ({"classes": [1, "1"]}, "classes must be distinct"),
    ({"features": ["a", "b", "a"]}, "features must be distinct"),
    ({"row_id": "y"}, "row_id: column 'y' is the label, the text or a feature"),
    ({"row_id": "a", "features": ["a", "b"]}, "row_id: column 'a' is the label, the text or a feature"),
    ({"text": "note", "features": ["a"]}, "a text column is the whole input"),
    ({"max_length": 16}, "max_length applies to a text column only"),
])
def test_a_file_and_a_table_are_checked_alike(where, columns, message):
    """Each fact once: a file's and a table's columns are one base's (specs.sections.data.ColumnsSource), so
    the same columns are refused alike whichever holds them."""
    from pydantic import TypeAdapter, ValidationError

    from specs.sections.data import Source

    with pytest.raises(ValidationError, match=re.escape(message)):
        TypeAdapter(Source).validate_python({**where, "label": "y", "classes": [0, 1], **columns})


def test_the_source_traits_say_which_sources_have_columns_and_read_by_window():
    from specs.sections.data import ColumnsSource, FileSource, SqlSource
    from specs.traits import COLUMN_SOURCES, SOURCES

    assert {k for k, t in SOURCES.items() if t.columns} == {"file", "sql"} and COLUMN_SOURCES == "file or sql"
    assert {k for k, t in SOURCES.items() if t.windowed} == {"sql"}
    assert issubclass(FileSource, ColumnsSource) and issubclass(SqlSource, ColumnsSource)
