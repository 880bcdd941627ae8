"""Spec fuzzing: random and mutated specs are either valid or refused with one line naming a field; never
a traceback, and validating one creates nothing (no MLflow store, ledger, checkpoint or .privzo folder).

The generators start from every shipped example (specs/examples) and mutate it (dropped keys, unknown keys,
values of the wrong type, unknown kinds, extreme numbers, NaN and infinities, huge strings and lists, unicode
and control characters, deep nesting, non-mapping top levels), write YAML oddities (tabs, anchors and
aliases, merge keys, duplicate keys, explicit and binary tags, a billion laughs, invalid UTF-8), or draw
JSON-like trees at random. Each case goes in the ways a user's spec does: ``specs.spec_from_dict``,
``specs.load_spec`` on a written file, and ``privzo validate``. A few hundred cases here;
``bench/fuzz_specs.py`` runs the same generators on 10,000.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import specs
from specs.loading import MAX_DEPTH, SHORT, _key_text

EXAMPLES = Path(__file__).resolve().parents[2] / "specs" / "examples"
# the examples whose model ships (validate in an empty home finds it); the language-model ones name a decoder
# the recipe makes in ~/.privzo/models (tests/conftest.py SHIPPED_EXAMPLES, kept apart: bench/ imports this)
EXAMPLE_TEXTS = [p.read_text(encoding="utf-8") for p in sorted(EXAMPLES.glob("*.yaml"))
                 if not p.name.startswith("chatterbot_lm_")]
EXAMPLE_DICTS = [yaml.safe_load(text) for text in EXAMPLE_TEXTS]
SECTIONS = sorted(specs.RunSpec.model_fields)


def _kinds(value: Any) -> set:
    found = set()
    if isinstance(value, dict):
        if isinstance(value.get("kind"), str):
            found.add(value["kind"])
        for item in value.values():
            found |= _kinds(item)
    return found


# every kind the examples use, plus the rest of the registry and near misses
KINDS = sorted(set().union(*map(_kinds, EXAMPLE_DICTS)) | {
    "linear", "cnn", "file", "images", "text", "hashed", "column", "source", "pazo_p", "fixed_size", "full_batch",
    "adam", "none", "two-point", "Two_Point", "GAUSSIAN", "mlp ", " sgd", "resnet", "", "kind", "auto", "null"})
KEYS = sorted({"kind", "name", "path", "epsilon", "delta", "lr", "steps", "epochs", "hidden", "queries", "clip",
               "classes", "label", "tokenizer", "public", "test", "imbalance", "uri", "dir", "ledger", "dataset",
               "querys", "optimiser", "Epsilon", "noise-multiplier", "<<", "declared_private_rows"} | set(SECTIONS))

NUMBERS = [0, -1, 1, 2, 0.5, -0.0, 1e308, -1e308, 1.7976931348623157e308, 5e-324, 1e-300, 10 ** 40, -(10 ** 40),
           2 ** 63 - 1, 2 ** 63, 2 ** 64, float("inf"), float("-inf"), float("nan")]
STRINGS = ["", " ", "auto", "none", "null", "~", "yes", "0", "1e3", ".inf", ".nan", "NaN", "-1", "\x00", "a\x00b",
           "a\nb", "\r\n", "\t", "\u2028", "\x85", "\x1b[31mred", "\ud800", "a\udcffb", "\ufeff", "名前", "😀",
           "e\u0301", "../../etc/passwd", "~nosuchuser-privzo/x", "~/data.csv", "~", "/", ".", "C:\\data\\x.csv",
           "sqlite:///x.db", "sqlite://", "sqlite:///a\nb.db", "file:///tmp/x", "ftp://x", "http://", "s3://b/k",
           "postgresql://u@h/db", "x" * 101, "x" * 201, "-leading-dash", "digits:v1", "a b", "a/b", "a.b"]
SIZES = [10, 1_000, 10_000]


def numbers() -> st.SearchStrategy[Any]:
    # an integer of thousands of digits has no repr (Python refuses to print it), so it is built, not listed
    return st.one_of(st.sampled_from(NUMBERS), st.integers(), st.floats(),
                     st.integers(4_000, 6_000).map(lambda digits: 10 ** digits))


def text_values() -> st.SearchStrategy[str]:
    """Unicode of every category, with control characters, lone surrogates and line separators."""
    chars = st.one_of(st.characters(codec=None), st.characters(categories=["Cs", "Cc", "Zl", "Zp", "Cf"]))
    return st.one_of(st.sampled_from(STRINGS), st.text(chars, max_size=30))


def huge_values() -> st.SearchStrategy[Any]:
    return st.builds(lambda n, kind: {"str": "x" * (10 * n), "ints": [1] * n, "strs": ["x"] * n,
                                      "floats": [0.5] * n, "dict": {f"k{i}": i for i in range(n)}}[kind],
                     st.sampled_from(SIZES), st.sampled_from(["str", "ints", "strs", "floats", "dict"]))


def nest(depth: int, kind: str = "list") -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"kind": value} if kind == "kind" else {"a": value}
    return value


def deep_values() -> st.SearchStrategy[Any]:
    return st.builds(nest, st.sampled_from([MAX_DEPTH - 2, MAX_DEPTH, MAX_DEPTH + 1, 200, 3000]),
                     st.sampled_from(["list", "dict", "kind"]))


def json_trees(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), numbers(), text_values(), st.sampled_from(KINDS))
    keys = st.one_of(st.sampled_from(KEYS), text_values())
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(keys, inner, max_size=5)),
                        max_leaves=max_leaves)


def weird_values() -> st.SearchStrategy[Any]:
    """Wrong types and extremes, for any field."""
    return st.one_of(numbers(), st.booleans(), st.none(), text_values(), st.sampled_from(KINDS),
                     st.binary(max_size=8), st.dates(), huge_values(), deep_values(), json_trees(), st.just([]),
                     st.just({}), st.sampled_from(EXAMPLE_DICTS).map(lambda d: _copy(d["data"])))


# ------------------------------------------------------------------ mutated examples
def _entries(tree: Any) -> List[Tuple[Any, Any]]:
    """(container, key) for every value below the top, dicts and lists alike."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            out.append((node, key))
            stack.append(value)
    return out


def _copy(tree: Any) -> Any:
    return json.loads(json.dumps(tree))  # the examples are JSON: a fresh copy, fast


@st.composite
def mutated_specs(draw: Callable) -> Any:
    """An example spec with one to four mutations."""
    spec = _copy(draw(st.sampled_from(EXAMPLE_DICTS)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 4]))):
        if not isinstance(spec, dict):
            break
        op = draw(st.sampled_from(["drop", "unknown", "replace", "replace", "number", "nearby", "kind", "section",
                                   "section", "top"]))
        entries = _entries(spec)
        if op == "drop" and entries:
            owner, key = draw(st.sampled_from(entries))
            del owner[key]
        elif op == "unknown":
            owners = [spec] + [o[k] for o, k in entries if isinstance(o[k], dict)]
            draw(st.sampled_from(owners))[draw(st.one_of(st.sampled_from(KEYS), text_values()))] = draw(
                weird_values())
        elif op == "replace" and entries:
            owner, key = draw(st.sampled_from(entries))
            owner[key] = draw(weird_values())
        elif op == "number":
            numeric = [(o, k) for o, k in entries if isinstance(o[k], (int, float)) and not isinstance(o[k], bool)]
            if numeric:
                owner, key = draw(st.sampled_from(numeric))
                owner[key] = draw(numbers())
        elif op == "nearby":  # another plausible number: often still valid, so the cross-field rules run
            numeric = [(o, k) for o, k in entries if type(o[k]) in (int, float)]
            if numeric:
                owner, key = draw(st.sampled_from(numeric))
                owner[key] = draw(st.integers(0, 2_000) if type(owner[key]) is int else st.floats(0, 10))
        elif op == "kind":
            owners = [o[k] for o, k in entries if isinstance(o[k], dict) and "kind" in o[k]]
            if owners:
                draw(st.sampled_from(owners))["kind"] = draw(st.one_of(st.sampled_from(KINDS), weird_values()))
        elif op == "section":  # a section of another example: often a valid spec, or a cross-field refusal
            other = draw(st.sampled_from(EXAMPLE_DICTS))
            section = draw(st.sampled_from(sorted(other)))
            spec[section if draw(st.booleans()) else draw(st.sampled_from(sorted(other)))] = _copy(other[section])
        elif op == "top":
            spec = draw(st.one_of(weird_values(), st.just(list(spec.items()))))
    return spec


def random_trees() -> st.SearchStrategy[Any]:
    """JSON-like trees: a mapping of section names to anything, or anything at all."""
    return st.one_of(st.dictionaries(st.sampled_from(SECTIONS), json_trees(), min_size=1, max_size=len(SECTIONS)),
                     json_trees(max_leaves=30))


# ------------------------------------------------------------------ YAML text
def _laughs(levels: int) -> str:
    """A billion laughs: level k holds nine aliases of level k-1 (9**levels leaves from a few lines)."""
    lines = ["lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"lol{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]" for k in range(1, levels)]
    return "\n".join(lines)


VALUE_SNIPPETS = [
    "!!binary aGVsbG8=", "!!binary 'not base64!'", "!!int x", "!!int 0x", "!!float x", "!!bool maybe",
    "!!timestamp x", "2001-13-45", "2001-02-29", "2001-12-14t21:59:43.10-25:00", "!!map [1, 2]", "!!map x",
    "!!seq {a: 1}", "!!set {a, b}", "!!set [a]", "!!omap [a: 1, b: 2]", "!!omap {a: 1}", "!!pairs [a: 1]",
    "!!str", "!!null x", "!!python/object:os.system x", "!!python/name:os.system", "!custom x", "!<tag:x> 1",
    "&a [*a]", "&b {b: *b}", "*undefined", "9" * 5000, "0x" + "f" * 5000, "-" + "9" * 30, "1e999", "-.inf",
    ".NaN", "190:20:30", "0o777", "0b101", "~", "null", "{", "[", "'unterminated", '"\\ud800"', '"\\x00"',
    '"a\\nb"', '"\\u2028"', "{? [1]: 2}", "{? {a: 1}: 2}", "{[1, 2]: 3}", "{<<: {kind: linear}}", "{<<: [1]}",
    "{<<: 5}", "{<<: [{kind: linear}, {kind: mlp}]}", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "[" * 3000 + "]" * 3000, "{a: " * 400 + "1" + "}" * 400, "%YAML 1.1", "\t1", "|\n  block\n  text", ">-",
    "'\x01'", "'\x7f'", '"\\e\\a"', "[1, 2, 3" + ", 4" * 5_000 + "]",
]
DOCUMENTS = ["", "~", "null", "- a\n- b\n", "42", "'text'", "a: 1\n---\nb: 2\n", "--- !!map\n", "---\n...\n",
             "!!set {a, b}", "[1, 2]", "? [1]\n: 2\n", "a: 1\na: 2\n", "a: {b: 1, b: 2}\n", "\t", "%TAG ! x\n",
             "&a [*a, *a]", "a: &a {b: 1}\nc: *a\nc: 2\n", _laughs(9) + "\n", "lol: " + "[" * 100_000]


def _dump(tree: Any) -> Optional[str]:
    try:
        return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
    except Exception:  # the generator's own limits (a 3000-deep tree), not privzo's
        return None


PLACEHOLDER = "FUZZ-PLACEHOLDER-7f3a"


@st.composite
def yaml_texts(draw: Callable) -> Union[str, bytes]:
    """YAML files: an example with its text mutated, or with a value written as a YAML oddity."""
    how = draw(st.sampled_from(["value", "value", "merge", "anchor", "text", "text", "document", "laughs",
                                "bytes", "random"]))
    base = draw(st.sampled_from(range(len(EXAMPLE_TEXTS))))
    text, tree = EXAMPLE_TEXTS[base], _copy(EXAMPLE_DICTS[base])
    if how in ("value", "merge", "anchor", "laughs"):
        entries = _entries(tree)
        owner, key = draw(st.sampled_from(entries))
        original = owner[key]
        owner[key] = PLACEHOLDER
        if how == "value":
            snippet = draw(st.sampled_from(VALUE_SNIPPETS))
        elif how == "merge":  # the value written as a '<<' merge of itself (and, at times, one key overridden)
            extra = f", {key}: {json.dumps(original)}" if draw(st.booleans()) and isinstance(key, str) else ""
            snippet = "{<<: " + json.dumps(original) + extra + "}"
        elif how == "anchor":  # an anchor on one value and aliases to it elsewhere (before or after)
            snippet = "&fz " + json.dumps(original)
            for owner2, key2 in draw(st.lists(st.sampled_from(entries), max_size=3)):
                if owner2[key2] != PLACEHOLDER:
                    owner2[key2] = PLACEHOLDER + "-alias"
        else:
            snippet = "*l8"
        dumped = _dump(tree) or text
        text = dumped.replace(f"'{PLACEHOLDER}-alias'", "*fz").replace(f"{PLACEHOLDER}-alias", "*fz")
        text = text.replace(f"'{PLACEHOLDER}'", snippet).replace(PLACEHOLDER, snippet)
        if how == "laughs":
            text = _laughs(9) + "\n" + text
        return text
    if how == "text":
        lines = text.splitlines(keepends=True)
        line = draw(st.sampled_from(range(len(lines))))
        edit = draw(st.sampled_from(["tabs", "delete", "duplicate", "insert", "truncate", "crlf", "bom"]))
        if edit == "tabs":
            lines[line] = re.sub(r"^ +", lambda m: "\t" * max(1, len(m.group()) // 2), lines[line])
        elif edit == "delete":
            del lines[line]
        elif edit == "duplicate":  # a duplicate key, at the top or inside a section
            lines.insert(line, lines[line])
        elif edit == "insert":
            at = draw(st.integers(0, len(lines[line])))
            lines[line] = lines[line][:at] + draw(st.one_of(text_values(), st.sampled_from(
                [":", "{", "}", "[", "&", "*", "!", "!!", "|", "#", "'", '"', "%", "@", "`", "<<: ", "- "]))) + \
                lines[line][at:]
        elif edit == "truncate":
            return text[:draw(st.integers(0, len(text)))]
        elif edit == "crlf":
            return text.replace("\n", "\r\n")
        else:
            return "\ufeff" + text
        return "".join(lines)
    if how == "document":
        return draw(st.sampled_from(DOCUMENTS))
    if how == "bytes":  # not UTF-8: a Latin-1 file, or random bytes
        return draw(st.one_of(st.just(text.replace("seed", "séed").encode("latin-1", "replace")), st.binary(max_size=64)))
    return draw(text_values())


# ------------------------------------------------------------------ the property
SECTION_OR_KEY = r"(?:[\w-]+|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"|<[^>]*>)"
FIELD = re.compile(rf"{SECTION_OR_KEY}(?:\.{SECTION_OR_KEY})*(?=[: ]|\.\.\.: )")
# problems with the file as a whole, before there are fields
WHOLE_FILE = ("not valid YAML", "the spec is empty", "expected a mapping of sections", "cannot read spec")
# read at a glance (specs.loading.SHORT, after the file's name), in privzo's words: never pydantic's model classes
MAX_MESSAGE = SHORT
PYDANTIC_WORDS = re.compile(r"instance of [A-Z]|object to extract fields from|\b[A-Z][a-z]+Spec\b")


def check_refusal(err: specs.SpecError, data: Any = None, origin: Optional[str] = None) -> str:
    """A refusal is one non-empty line that starts by naming a field (or, for a file that is not YAML, says
    so), and is short enough to read."""
    message = str(err)
    assert message and len(message.splitlines()) == 1, f"not one line: {message!r}"
    if origin is not None:
        assert message.startswith(f"{origin}: "), message
        message = message[len(origin) + 2:]
    # besides this folder's path, which a message may name (a relative path's absolute form)
    assert len(message.replace(os.getcwd(), "")) <= MAX_MESSAGE, f"{len(message)} characters: {message[:400]!r}"
    # a value the spec gave comes back quoted (a mutated kind may read 'AaSpec'); pydantic's class names do not
    unquoted = re.sub(r"'(?:\\.|[^'\\])*'", "''", message)
    assert not PYDANTIC_WORDS.search(unquoted), f"in pydantic's words: {message!r}"
    if message.startswith(WHOLE_FILE):
        return message
    head = FIELD.match(message)
    assert head, f"names no field: {message!r}"
    if isinstance(data, dict):  # the field is one of the spec's sections, or a key the spec gave
        first = re.match(SECTION_OR_KEY, message).group()
        assert first in set(SECTIONS) | {"spec"} | {_key_text(k) for k in data}, f"names no field: {message!r}"
    return message


def outcome(call: Callable[[], Any], check: Callable[[specs.SpecError], str]) -> str:
    """'valid' or 'rejected'; any exception but privzo's SpecError propagates (a crash)."""
    try:
        call()
    except specs.SpecError as err:
        check(err)
        return "rejected"
    return "valid"


@dataclass
class Case:
    """One spec: a Python tree (given to spec_from_dict, and written as YAML) or the text of a file."""

    tree: Any = None
    text: Union[str, bytes, None] = None
    source: str = ""  # the generator that made it

    def file_bytes(self) -> Optional[bytes]:
        text = self.text if self.tree is None else _dump(self.tree)
        if text is None or isinstance(text, bytes):
            return text
        return text.encode("utf-8", "surrogatepass")  # a lone surrogate makes the file invalid UTF-8


GENERATORS = {  # name -> strategy of cases
    "mutated example": mutated_specs().map(lambda t: Case(tree=t, source="mutated example")),
    "random tree": random_trees().map(lambda t: Case(tree=t, source="random tree")),
    "YAML text": yaml_texts().map(lambda t: Case(text=t, source="YAML text")),
}


def cases() -> st.SearchStrategy[Case]:
    return st.one_of(*GENERATORS.values())


def run_case(case: Case, folder: Path, cli: bool = False) -> dict:
    """Every way in for ``case``: {'spec_from_dict' | 'load_spec' | 'cli': 'valid' | 'rejected'}. Raises on a
    broken property (AssertionError) or a crash (anything else), including one a library swallowed and
    printed as 'Exception ignored in ...' (pydantic did, for a repr too deep to take)."""
    swallowed: List[str] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: swallowed.append(f"{u.exc_type.__name__}: {u.exc_value}")
    try:
        results = _run_case(case, folder, cli)
    finally:
        sys.unraisablehook = hook
    assert not swallowed, f"a swallowed exception would print a traceback: {swallowed[0]}"
    return results


def _run_case(case: Case, folder: Path, cli: bool) -> dict:
    results = {}
    if case.tree is not None:
        results["spec_from_dict"] = outcome(lambda: specs.spec_from_dict(case.tree),
                                            lambda err: check_refusal(err, case.tree))
    content = case.file_bytes()
    if content is None:
        return results
    path = folder / "spec.yaml"
    path.write_bytes(content)
    for data in ("stream",):  # the examples' own data folders, which their relative paths name
        if not (folder / data).exists():
            (folder / data).symlink_to(EXAMPLES / data, target_is_directory=True)
    results["load_spec"] = outcome(lambda: specs.load_spec(path), lambda err: check_refusal(err, origin=str(path)))
    if cli:
        results["cli"] = validate_in_empty_home(path, results["load_spec"])
    return results


def validate_in_empty_home(path: Path, expected: str) -> str:
    """``privzo validate`` with HOME and the working directory set to the spec's own empty folder: it
    agrees with load_spec, prints one line, and leaves the folder as it was."""
    from flows.cli import main

    folder = path.parent
    before = sorted(folder.rglob("*"))
    # the interpreter's own streams: stdout strict UTF-8 (a lone surrogate would raise), stderr backslashreplace
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    cwd, home = os.getcwd(), os.environ.get("HOME")
    os.chdir(folder)
    os.environ["HOME"] = str(folder)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["validate", str(path)])
        out.flush()
        err.flush()
    finally:
        os.chdir(cwd)
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
    stdout, stderr = (s.buffer.getvalue().decode("utf-8", "backslashreplace") for s in (out, err))
    created = sorted(set(folder.rglob("*")) - set(before))
    assert not created, f"validate created {created}"
    if expected == "valid":
        assert code == 0 and stdout.startswith("ok: ") and not stderr, (code, stdout, stderr)
        return "valid"
    assert code == 2 and not stdout, (code, stdout, stderr)
    assert stderr.startswith("privzo: error: ") and len(stderr.splitlines()) == 1, stderr
    return "rejected"


# ------------------------------------------------------------------ tests
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.large_base_example, HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory(prefix="privzo-fuzz-") as name:
        yield Path(name)


@settings(FUZZ, max_examples=150)
@given(tree=mutated_specs())
def test_mutated_examples_are_valid_or_refused_in_one_line(folder, tree):
    run_case(Case(tree=tree), folder)


@settings(FUZZ, max_examples=60)
@given(tree=random_trees())
def test_random_trees_are_valid_or_refused_in_one_line(folder, tree):
    run_case(Case(tree=tree), folder)


@settings(FUZZ, max_examples=150)
@given(text=yaml_texts())
@example(text=_laughs(9) + "\nname: laughs\n")
@example(text="name: x\nmodel: " + "[" * 5000 + "]" * 5000 + "\n")
def test_yaml_oddities_are_valid_or_refused_in_one_line(folder, text):
    run_case(Case(text=text), folder)


@settings(FUZZ, max_examples=40)
@given(case=cases())
def test_validate_creates_nothing_in_home_or_working_directory(case):
    with tempfile.TemporaryDirectory(prefix="privzo-fuzz-home-") as name:
        run_case(case, Path(name), cli=True)


# ------------------------------------------------------------------ what the fuzzing found, fixed
def _spec(**changes) -> dict:
    spec = _copy(EXAMPLE_DICTS[0])
    for dotted, value in changes.items():
        *owners, key = dotted.split("__")
        node = spec
        for name in owners:
            node = node[name]
        node[key] = value
    return spec


@pytest.mark.parametrize("text, fragments", [
    # PyYAML raised TypeError building the duplicate-key check's set
    ("? [1]\n: 2\n", ["not valid YAML at line 1", "a list cannot be a key"]),
    ("a: {? {b: 1}: 2}\n", ["not valid YAML at line 1", "a dict cannot be a key"]),
    # RecursionError in PyYAML's composer
    ("a: " + "[" * 5000 + "]" * 5000, ["not valid YAML at line 1", f"nested more than {MAX_DEPTH} levels"]),
    ("a: " + "{b: " * 3000 + "1" + "}" * 3000, ["not valid YAML at line 1", f"nested more than {MAX_DEPTH} levels"]),
    # ValueError: Python will not read an integer of more than 4300 digits
    ("seed: " + "9" * 5000 + "\n", ["not valid YAML at line 1", "an integer of 5000 characters", "2**63"]),
    # ValueError, AttributeError, KeyError, TypeError from PyYAML's constructors
    ("a: 2001-13-45\n", ["not valid YAML at line 1", "cannot read '2001-13-45' as !!timestamp"]),
    ("a: !!timestamp x\n", ["not valid YAML at line 1", "cannot read 'x' as !!timestamp"]),
    ("a: !!int x\n", ["cannot read 'x' as !!int"]),
    ("a: !!float x\n", ["cannot read 'x' as !!float"]),
    ("a: !!bool maybe\n", ["cannot read 'maybe' as !!bool"]),
    ("a: !!map [1, 2]\n", ["not valid YAML at line 1", "expected a mapping, found sequence"]),
    ("a: !!map x\n", ["expected a mapping, found scalar"]),
    # a billion laughs: pydantic printed a `kind` of 43 million aliased values whole (minutes, gigabytes)
    (_laughs(9) + "\nname: x\nmodel: {kind: *l8}\n", ["lol6: stands for more than 1,000,000 values"]),
    # aliases nest without the composer recursing: 120 levels from 120 short lines
    ("\n".join(["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 120)]),
     [f"nested more than {MAX_DEPTH} levels deep"]),
    ("a: &a [1, *a]\n", ["a.1: a YAML alias that refers to the collection holding it"]),
    # the position of a character YAML refuses, as a line
    ("name: x\nseed: \x01\n", ["not valid YAML at line 2", "character 0x0001 is not allowed"]),
])
def test_yaml_that_crashed_the_loader_is_refused_in_one_line(folder, text, fragments):
    path = folder / "found.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(specs.SpecError) as info:
        specs.load_spec(path)
    message = check_refusal(info.value, origin=str(path))
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("tree, fragments", [
    # pydantic raised ValueError printing an integer of thousands of digits (its input, a key, a kind)
    (_spec(seed=10 ** 5000), ["seed: an integer of about 5001 digits", "|x| < 2**63"]),
    (_spec(name=10 ** 5000), ["name: an integer of about 5001 digits"]),
    (_spec(model__kind=10 ** 5000), ["model.kind: an integer of about 5001 digits"]),
    (_spec(data__source__classes=[10 ** 5000, 1]), ["data.source.classes.0: an integer"]),
    (_spec(privacy__epsilon=10 ** 400), ["privacy.epsilon: an integer of about 401 digits", "1e40"]),
    # pydantic swallowed a RecursionError printing a 3000-deep `kind` ("Exception ignored in ..." on stderr)
    (_spec(estimator__kind=nest(3000)), ["estimator.kind.0...: nested more than"]),
    # a seed or a count beyond 64 bits validated, and failed in torch or SQLite once the run had started
    (_spec(seed=2 ** 64), ["seed: an integer of about 20 digits"]),
    (_spec(optimizer__steps=10 ** 40), ["optimizer.steps: an integer of about 41 digits"]),
    # NaN and infinities are refused in every number field (PositiveFloat alone admits inf)
    (_spec(privacy__epsilon=float("inf")), ["privacy.epsilon: Input should be a finite number (found inf)"]),
    (_spec(optimizer__lr=float("nan")), ["optimizer.lr: Input should be a finite number (found nan)"]),
    (_spec(mechanism__noise_multiplier=float("-inf")), ["mechanism.noise_multiplier", "finite number, or 'auto'"]),
    # a NUL validated in paths and names, and failed in the first system call of the run
    (_spec(checkpoint={"dir": "ckpt\x00"}), ["checkpoint.dir: holds a NUL character", "(found 'ckpt\\x00')"]),
    (_spec(data__source={"kind": "file", "path": "a\x00.csv", "label": "y", "classes": [0, 1]}),
     ["data.source.path: holds a NUL character"]),
    # a message quoting a value with a line break stayed one line only by chance
    (_spec(budget={"dataset": "d", "lifetime_epsilon": 9.0, "ledger": "sqlite:///a\nb.db"}),
     ["budget.ledger: a relative SQLite path", "a\\nb.db"]),
    # 10,000 wrong items gave 10,000 problems; a megabyte name was quoted whole
    (_spec(model={"kind": "mlp", "hidden": ["x"] * 10_000}), ["model.hidden.0: Input should be a valid integer",
                                                             "more problems"]),
    (_spec(name="x" * 1_000_000), ["name: use letters", "(found 'xxxxxxxx", "...xxxx", "xxxx')"]),
    (_spec(data__source={"kind": "file", "path": "x.csv", "label": "y", "classes": [[1], 2]}),
     ["data.source.classes.0: Input should be a valid integer; data.source.classes.0: Input should be a valid "
      "string"]),
])
def test_trees_that_crashed_or_misled_are_refused_in_one_line(tree, fragments):
    with pytest.raises(specs.SpecError) as info:
        specs.spec_from_dict(tree)
    message = check_refusal(info.value, tree)
    assert len(message) < 3000
    for fragment in fragments:
        assert fragment in message, message


def test_an_unknown_users_home_is_refused_in_one_line(folder):
    """pathlib's expanduser raised RuntimeError for ~nosuchuser; os.path's raised ValueError for ~ and a NUL."""
    for written in ("~nosuchuser-privzo/x.csv", "~\x00x/x.csv"):
        tree = _spec(data__source={"kind": "file", "path": written, "label": "y", "classes": [0, 1]})
        path = folder / "home.yaml"
        path.write_text(yaml.safe_dump(tree), encoding="utf-8")
        with pytest.raises(specs.SpecError) as info:
            specs.load_spec(path)
        check_refusal(info.value, origin=str(path))
        assert "data.source.path: " in str(info.value), str(info.value)


def test_merge_keys_and_aliases_read_as_the_mapping_they_stand_for(folder):
    """'<<: *anchor' was refused ('could not determine a constructor for the tag merge'): the duplicate-key
    check constructed the merge key itself. Now a merged section is the section, and an explicit key
    overrides a merged one (that is what a merge is for, not a duplicate)."""
    tree = EXAMPLE_DICTS[0]
    text = yaml.safe_dump({k: v for k, v in tree.items() if k not in ("mechanism", "optimizer")}, sort_keys=False)
    text += (f"mechanism: &mech {json.dumps(tree['mechanism'])}\n"
             f"optimizer: {{<<: {json.dumps(tree['optimizer'])}, lr: 0.125}}\n")
    path = folder / "merge.yaml"
    path.write_text(text, encoding="utf-8")
    spec = specs.load_spec(path)
    assert spec.optimizer.lr == 0.125 and spec.optimizer.kind == tree["optimizer"]["kind"]
    assert spec.mechanism.clip == tree["mechanism"]["clip"]


def test_sections_of_other_examples_make_valid_specs():
    """The mutations are not all fatal: a section taken from another example often still validates, so the
    fuzzing reaches the cross-field rules and the valid path, not only the first type error."""
    import random

    rng, valid = random.Random(0), 0
    for _ in range(60):
        tree = _copy(rng.choice(EXAMPLE_DICTS))
        other = rng.choice(EXAMPLE_DICTS)
        section = rng.choice(sorted(other))
        tree[section] = _copy(other[section])
        valid += outcome(lambda: specs.spec_from_dict(tree), lambda err: check_refusal(err, tree)) == "valid"
    assert valid > 10
