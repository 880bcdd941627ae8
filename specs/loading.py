"""YAML -> RunSpec, with every problem reported on one readable line."""
from __future__ import annotations

import json
import os
import re
import reprlib
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Any, Dict, List, Optional, Tuple, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from specs.refusal import ValueRefusal
from specs.run import NAME_PATTERN, RunSpec, released_dump
from specs.sections import DATASET_PATTERN
from specs.traits import MODELS


# characters that end a line for str.splitlines (and so for a terminal or a log reader)
_LINE_BREAKS = {c: repr(chr(c))[1:-1] for c in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


class SpecError(ValueRefusal):
    """A spec that cannot run. ``str(err)`` is one line naming the bad fields and what is allowed, at most
    SHORT characters (the problems that fit, then how many more); ``problems`` holds every one of them."""

    def __init__(self, message: str = "", problems: Optional[List[str]] = None) -> None:
        # a value quoted from the spec (a path, a key) may hold a line break; the message stays one line
        super().__init__(str(message).translate(_LINE_BREAKS))
        self.problems = [str(p).translate(_LINE_BREAKS) for p in problems] if problems else [str(self)]


# A spec is a few levels deep (data.split.public_source.path is the deepest); far deeper YAML is a mistake or
# an attack, and PyYAML's composer recurses once per level (thousands of levels: RecursionError).
MAX_DEPTH = 50
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (plain YAML silently keeps the last one), nesting deeper than
    MAX_DEPTH, and reports a scalar no constructor can read (``!!int x``, a 13th month, an integer of
    thousands of digits) as a YAML error at its line instead of a Python exception."""

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_DEPTH and not self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep; allowed: a "
                                              "few levels, as a spec's sections are", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (SpecError, yaml.YAMLError):
            raise
        except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as err:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            if tag == "!!int" and isinstance(err, ValueError) and isinstance(node.value, str) and len(node.value) > 100:
                problem = (f"an integer of {len(node.value)} characters; allowed: integers of at most 19 digits "
                           "(|x| < 2**63); a number field also takes a float such as 1e40")
            else:  # a scalar (a collection's own constructors raise YAML errors)
                what = _shown(node.value) if isinstance(node, yaml.ScalarNode) else f"this {node.id}"
                problem = f"cannot read {what} as {tag}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.Node, deep: bool = False) -> Dict[Any, Any]:
    if not isinstance(node, yaml.MappingNode):  # an explicit !!map on a list or a scalar
        raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found {node.id}", node.start_mark)
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # '<<: *anchor' merges the anchored mapping; its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(None, None, f"a {type(key).__name__} cannot be a key; keys are "
                                                    "names", key_node.start_mark)
        if key in seen:
            raise SpecError(f"{_key_text(key)}: duplicate key at line {key_node.start_mark.line + 1}; give it once")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, origin: str = "spec") -> Dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except SpecError as err:  # a duplicate key
        raise SpecError(f"{origin}: {err}") from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow (a control character, a lone surrogate)
        at = err.position if isinstance(err.position, int) else 0
        code = err.character if isinstance(err.character, int) else ord(str(err.character)[:1] or "?")
        raise SpecError(f"{origin}: not valid YAML at line {text.count(chr(10), 0, at) + 1}: character "
                        f"{code:#06x} is not allowed in YAML text ({err.reason})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
        raise SpecError(f"{origin}: not valid YAML{where}: {problem}") from None
    if data is None:
        raise SpecError(f"{origin}: the spec is empty; `privzo schema` lists its sections")
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: expected a mapping of sections (name, data, model, ...), found {type(data).__name__}")
    return data


def load_spec(path: Union[str, Path]) -> RunSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{path}: cannot read spec ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: cannot read spec (not UTF-8 text: byte {err.object[err.start]:#04x} at position "
                        f"{err.start})") from None
    except ValueError:  # a NUL in the path
        raise SpecError(f"{_shown(str(path))}: cannot read spec (a path cannot hold a NUL character)") from None
    try:
        return spec_from_dict(_anchor_paths(parse_yaml(text, str(path)), path.parent))
    except SpecError as err:
        message = str(err)
        # every message names the file it is about (a sweep reads several)
        raise SpecError(message if message.startswith(f"{path}:") else f"{path}: {message}",
                        problems=err.problems) from None


def _anchor_paths(data: Dict[str, Any], folder: Path) -> Dict[str, Any]:
    """A relative path (``data.source.path``, ``data.split.public_source.path``, ``model.path``, a tokenizer
    folder) is taken from the spec file's folder, wherever privzo runs from (a Prefect worker's working
    directory is not the user's); the spec is then carried with the absolute path."""
    section = data.get("data") if isinstance(data.get("data"), dict) else {}
    split = section.get("split") if isinstance(section.get("split"), dict) else {}
    model = data.get("model") if isinstance(data.get("model"), dict) else {}

    def anchor(owner: Any, key: str, field: str) -> None:
        value = owner.get(key) if isinstance(owner, dict) else None
        if not isinstance(value, str) or not value or "\x00" in value:  # validation names what is wrong
            return
        path = os.path.expanduser(value)
        if path.startswith("~"):  # no such user here (pathlib's expanduser raises RuntimeError)
            raise SpecError(f"{field}: {_shown(value)} names the home of an unknown user; allowed: an absolute "
                            "path, ~/... for your own home, or a path relative to the spec's folder")
        owner[key] = os.path.normpath(path if os.path.isabs(path) else os.path.abspath(folder / path))

    # the pretrained kinds (hf, causal_lm, masked_lm) read a folder; any other kind has no path to anchor
    pretrained = MODELS.get(model.get("kind")) if isinstance(model.get("kind"), str) else None
    written_model_path = model.get("path") if pretrained is not None and pretrained.pretrained else None
    if written_model_path is not None:
        anchor(model, "path", "model.path")
    for source, field in ((section.get("source"), "data.source"), (split.get("public_source"),
                                                                   "data.split.public_source")):
        if not isinstance(source, dict):
            continue
        if source.get("kind") in ("file", "completions", "images"):
            anchor(source, "path", f"{field}.path")
        if source.get("kind") == "sql" and isinstance(source.get("url"), str) and \
                source["url"].startswith("sqlite:///") and not source["url"].startswith("sqlite:////"):
            # a SQLite file named relative to the spec, as a file source's path is
            source["url"] = "sqlite:///" + os.path.abspath(folder / source["url"][len("sqlite:///"):])
        tokenizer = source.get("tokenizer")
        if written_model_path is not None and tokenizer == written_model_path:
            source["tokenizer"] = model["path"]  # the model's folder, written as model.path is
        elif isinstance(tokenizer, str) and "/" in tokenizer:  # a folder, not a registered name
            anchor(source, "tokenizer", f"{field}.tokenizer")
    return data


# torch's seeds, SQLite's INTEGER and every count privzo keeps are 64-bit; an integer far beyond that is
# never meant, and one of thousands of digits makes Python refuse to print it (pydantic's error included)
_INT_LIMIT = 2 ** 63
# A spec holds a few dozen values (a long class list: thousands). YAML aliases can make a few lines stand
# for billions (a billion laughs), and pydantic prints a wrong `kind` whole: refused before validation.
MAX_VALUES = 1_000_000
_COLLECTIONS = (dict, list, tuple, set, frozenset)


def spec_from_dict(data: Dict[str, Any]) -> RunSpec:
    problem = _shape_problem(data)
    if problem:
        raise SpecError(problem)
    try:
        return RunSpec.model_validate(data)
    except ValidationError as err:
        problems = problem_list(err)
        raise SpecError(_short(problems), problems=problems) from None


def _items(value: Any) -> List[Tuple[Any, Any]]:
    return list(value.items()) if isinstance(value, dict) else list(enumerate(value))


def _shape_problem(data: Any) -> Optional[str]:
    """What no field could take, found before pydantic sees it (pydantic prints a wrong ``kind`` whole, and
    recursively): an integer (value or key) beyond 64 bits, nesting deeper than MAX_DEPTH, a collection that
    contains itself (``&a [*a]``), or more than MAX_VALUES values once YAML aliases are expanded. Iterative,
    and each collection walked once, so a billion laughs costs its written size."""
    shape: Dict[int, Tuple[int, int]] = {}  # id -> (values it stands for, capped at MAX_VALUES + 1; height)
    active = set()  # ids of the collections on the path being walked
    stack: List[Tuple[Any, Tuple[Any, ...], bool]] = [(data, (), False)]
    while stack:
        value, loc, done = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_LIMIT:
            digits = int(value.bit_length() * 0.30103) + 1
            return (f"{_dotted(loc) or 'spec'}: an integer of about {digits} digits; allowed: integers of at most "
                    "19 digits (|x| < 2**63); a number field also takes a float such as 1e40")
        if not isinstance(value, _COLLECTIONS):
            continue
        if done:
            active.discard(id(value))
            inner = [shape[id(item)] if isinstance(item, _COLLECTIONS) else (1, 0) for _, item in _items(value)]
            size = 1 + sum(n for n, _ in inner) + (len(value) if isinstance(value, dict) else 0)
            shape[id(value)] = (min(size, MAX_VALUES + 1), 1 + max((h for _, h in inner), default=0))
            continue
        if len(loc) >= MAX_DEPTH:
            return _too_deep(loc)
        if id(value) in shape:
            continue
        if id(value) in active:
            return (f"{_dotted(loc) or 'spec'}: a YAML alias that refers to the collection holding it; allowed: "
                    "an alias of a value written before it, elsewhere")
        active.add(id(value))
        stack.append((value, loc, True))
        for key, item in reversed(_items(value)):  # reversed: popped in written order
            stack.append((item, loc + (key,), False))
            if isinstance(value, dict):
                stack.append((key, loc + (key,), False))
    size, height = shape.get(id(data), (1, 0))
    if size <= MAX_VALUES and height <= MAX_DEPTH:
        return None
    # aliases made it: name the outermost collection that alone is too large, or the way down that is too deep
    loc, value = (), data
    while True:
        over = [(k, v) for k, v in _items(value) if isinstance(v, _COLLECTIONS) and (
            shape[id(v)][0] > MAX_VALUES if size > MAX_VALUES else shape[id(v)][1] + len(loc) + 1 > MAX_DEPTH)]
        if not over:
            break
        loc, value = loc + (over[0][0],), over[0][1]
    if size <= MAX_VALUES:
        return _too_deep(loc)
    return (f"{_dotted(loc) or 'spec'}: stands for more than {MAX_VALUES:,} values (YAML aliases counted as "
            f"the values they repeat); allowed: at most {MAX_VALUES:,} in a spec")


def _too_deep(loc: Tuple[Any, ...]) -> str:
    return (f"{_dotted(loc[:3]) or 'spec'}{'...' if len(loc) > 3 else ''}: nested more than {MAX_DEPTH} levels "
            "deep; allowed: a few levels, as a spec's sections are")


def _dotted(loc: Tuple[Any, ...]) -> str:
    return ".".join(_key_text(part) for part in loc)


_PLAIN_KEY = re.compile(r"[\w-]{1,60}")  # a key shown as written; any other is quoted, so a path reads as one


def _key_text(key: Any) -> str:
    """A key or list index as the user wrote it; quoted where it is not a plain printable name."""
    if isinstance(key, int) and not isinstance(key, bool) and abs(key) < _INT_LIMIT:
        return str(key)
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return key
    return _shown(key)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset, _REPR.maxdict = 2, 4, 4, 4, 4


def _shown(value: Any, limit: int = 80) -> str:
    """A short repr of value, in time that does not grow with its size; never raises (an integer of
    thousands of digits has no repr)."""
    try:
        text = _REPR.repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else f"{text[:limit - 4]}...{text[-1]}"


def dump_yaml(spec: RunSpec) -> str:
    """The spec as YAML, as it is logged (spec.yaml): no URL's password (``released_dump``)."""
    return yaml.safe_dump(released_dump(spec), sort_keys=False)


def json_schema() -> str:
    return json.dumps(RunSpec.model_json_schema(), indent=2)


# ------------------------------------------------------------------ error formatting
_PATTERNS = {  # the spec's name patterns, in words
    NAME_PATTERN: "use letters, digits, '_', '.' and '-', starting with a letter or digit, at most 100 characters",
    DATASET_PATTERN:
        "use letters, digits, '_', '.', ':' and '-', starting with a letter or digit, at most 200 characters",
}


# A refusal is read at a glance: at most SHORT characters, the problems that fit and how many more there are
SHORT = 300
# pydantic's errors for a value that should have been a mapping (a section, or a kind's keys)
MAPPING_ERRORS = ("model_type", "model_attributes_type", "dict_type")


def _spec_models() -> Dict[str, type]:
    """Every model class of the spec by name (RunSpec and the models its fields hold, at any depth)."""
    found: Dict[str, type] = {}
    todo: List[Any] = [RunSpec]
    while todo:
        tp = todo.pop()
        if _is_model(tp):
            if tp.__name__ in found:
                continue
            found[tp.__name__] = tp
            todo.extend(f.annotation for f in tp.model_fields.values())
        else:
            todo.extend(get_args(tp))
    return found


def _mapping_problem(path: str, e: dict) -> str:
    """A section or a kind's keys given as something else than a mapping, in privzo's words."""
    model = _spec_models().get((e.get("ctx") or {}).get("class_name"))
    if not path:
        what = f"a mapping of sections ({', '.join(model.model_fields)})" if model is not None else "a mapping"
    elif model is not None:
        what = f"a mapping of its keys ({', '.join(model.model_fields)})"
    else:  # a section of several kinds (data.source, estimator, ...): its kind picks the keys
        what = "a mapping with its kind and that kind's keys (`privzo schema` lists them)"
    found = e.get("input")
    return f"{path or 'spec'}: must be {what}, not {_shown(found, 40)}"


def _short(parts: List[str]) -> str:
    """``parts`` joined by '; ', as many as fit in SHORT characters, then how many more there are. The first is
    always shown whole: privzo's own sentence for one problem says what to do (a path in it, say)."""
    out: List[str] = []
    for i, part in enumerate(parts):
        rest = len(parts) - i - 1
        tail = f"; and {rest} more problem{'s' if rest != 1 else ''}" if rest else ""
        if out and len("; ".join(out + [part])) + len(tail) > SHORT:
            left = len(parts) - len(out)
            return "; ".join(out) + f"; and {left} more problem{'s' if left != 1 else ''}"
        out.append(part)
    return "; ".join(out)


def format_errors(err: ValidationError) -> str:
    """One line: ``field.path: problem (found X; allowed: ...)`` for each error, joined by '; ', at most SHORT
    characters (the problems that fit, then how many more)."""
    return _short(problem_list(err))


def problem_list(err: ValidationError) -> List[str]:
    """Each problem of ``err`` in privzo's words: ``field.path: problem (found X; allowed: ...)``."""
    parts: List[str] = []
    unknown: Dict[str, List[str]] = {}  # a section's unknown keys, named together: one problem
    errors = err.errors(include_url=False)
    # A number-or-'auto' field fails in both union branches: pydantic reports each under a branch tag
    # (delta.constrained-float, delta.literal['auto']); the user wrote one field and gets one message.
    literals = {tuple(e["loc"][:-1]): e["loc"][-1][len("literal["):-1] for e in errors
                if e["loc"] and isinstance(e["loc"][-1], str) and e["loc"][-1].startswith("literal[")}
    for e in errors:
        loc = tuple(e["loc"])
        if loc[:-1] in literals and isinstance(loc[-1], str):  # a branch tag, not a list index
            if loc[-1].startswith("literal["):
                continue
            e = {**e, "msg": f"{e['msg']}, or {literals[loc[:-1]]}"}
            loc = loc[:-1]
        path, model = _walk(loc)
        kind = e["type"]
        if kind == "extra_forbidden":
            parent, _, key = path.rpartition(".")
            if parent not in unknown:
                unknown[parent] = []
                allowed = ", ".join(model.model_fields) if model is not None else "see `privzo schema`"
                parts.append((parent, allowed))  # its place among the problems; worded below
            unknown[parent].append(key)
        elif kind in MAPPING_ERRORS:
            parts.append(_mapping_problem(path, e))
        elif kind == "union_tag_invalid":
            ctx = e.get("ctx", {})
            parts.append(f"{path}.kind: unknown kind {_shown(ctx.get('tag'))}; allowed: {ctx.get('expected_tags')}")
        elif kind == "union_tag_not_found":
            parts.append(f"{path}: missing key 'kind'; see `privzo schema` for the allowed kinds")
        elif kind == "missing":
            parts.append(f"{path}: required key is missing")
        elif kind == "value_error" and not loc:
            parts.extend(m.strip() for m in str(e["ctx"]["error"]).split(" | "))
        else:
            msg = e["msg"]
            if kind == "value_error":
                msg = str(e["ctx"]["error"])
            elif kind == "string_pattern_mismatch":
                msg = _PATTERNS.get(e["ctx"]["pattern"], msg)
            found = e.get("input")
            # a URL refused for holding a password is never echoed: the message is logged and shown
            secret = kind == "value_error" and "password" in msg and path.endswith(".url")
            found_text = "" if isinstance(found, (dict, list)) or secret else f" (found {_shown(found)})"
            parts.append(f"{path or 'spec'}: {msg}{found_text}")
    worded = []
    for part in parts:
        if isinstance(part, tuple):  # a section's unknown keys
            parent, allowed = part
            keys = unknown[parent]
            if len(keys) == 1:
                part = f"{parent + '.' if parent else ''}{keys[0]}: unknown key; allowed keys here: {allowed}"
            else:
                part = f"{parent or 'spec'}: unknown keys {', '.join(keys)}; allowed keys here: {allowed}"
        worded.append(part)
    return list(dict.fromkeys(worded))


def _walk(loc: Tuple[Any, ...]) -> Tuple[str, Any]:
    """Return the user-facing dotted path for ``loc`` and the model class that owns its last key.

    pydantic inserts the discriminator tag into locations (``estimator.two_point.queries``); the user
    wrote ``estimator.queries``, so tags are dropped from the path.
    """
    names: List[str] = []
    current: Any = RunSpec
    owner: Any = None
    for part in loc:
        members = _union_members(current)
        if members is None and _is_model(current) and part not in current.model_fields:
            members = [current]  # a one-member union: pydantic unwraps it but keeps the tag in loc
        if members is not None:
            chosen = [m for m in members if _literal_value(m) == part]
            if chosen:
                current = chosen[0]
                continue
            if len(members) == 1:
                current = members[0]  # Optional[Model]: the key is the model's
        if get_origin(current) is Union and part in {getattr(a, "__name__", None) for a in get_args(current)}:
            continue  # a branch tag of Union[int, str] (data.source.classes.0.int): the user wrote classes.0
        names.append(_key_text(part))
        if _is_model(current):
            owner = current
            field = current.model_fields.get(part) if isinstance(part, str) else None
            current = field.annotation if field is not None else None
        else:
            owner = None
            args = get_args(current)
            current = args[0] if args else None
    return ".".join(names), owner


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _literal_value(model: Any) -> Any:
    field = model.model_fields.get("kind")
    args = get_args(field.annotation) if field is not None else ()
    return args[0] if args else None


def _union_members(tp: Any):
    """Members of a (possibly Annotated, possibly Optional) union of spec models, else None."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _union_members(get_args(tp)[0])
    if origin is Union:
        members = [a for a in get_args(tp) if _is_model(a)]
        return members or None
    return None
