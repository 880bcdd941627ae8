"""YAML -> RunSpec, with every problem reported on one readable line."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Dict, List, Tuple, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from specs.run import NAME_PATTERN, RunSpec
from specs.sections import DATASET_PATTERN


class SpecError(ValueError):
    """A spec that cannot run. ``str(err)`` is one line naming each bad field and what is allowed."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (plain YAML silently keeps the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise SpecError(f"{key}: duplicate key at line {key_node.start_mark.line + 1}; give it once")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, origin: str = "spec") -> Dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except SpecError as err:  # a duplicate key
        raise SpecError(f"{origin}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
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
        raise SpecError(f"{path}: cannot read spec ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: cannot read spec (not UTF-8 text: byte {err.object[err.start]:#04x} at position "
                        f"{err.start})") from None
    try:
        return spec_from_dict(_anchor_paths(parse_yaml(text, str(path)), path.parent))
    except SpecError as err:
        message = str(err)
        # every message names the file it is about (a sweep reads several)
        raise SpecError(message if message.startswith(f"{path}:") else f"{path}: {message}") from None


def _anchor_paths(data: Dict[str, Any], folder: Path) -> Dict[str, Any]:
    """A relative path (``data.source.path``, ``data.split.public_source.path``, ``model.path``, a tokenizer
    folder) is taken from the spec file's folder, wherever privzo runs from (a Prefect worker's working
    directory is not the user's); the spec is then carried with the absolute path."""
    section = data.get("data") if isinstance(data.get("data"), dict) else {}
    split = section.get("split") if isinstance(section.get("split"), dict) else {}
    model = data.get("model") if isinstance(data.get("model"), dict) else {}

    def anchor(owner: Any, key: str) -> None:
        if isinstance(owner, dict) and isinstance(owner.get(key), str) and owner[key]:
            path = Path(owner[key]).expanduser()
            owner[key] = os.path.normpath(path if path.is_absolute() else os.path.abspath(folder / path))

    written_model_path = model.get("path") if model.get("kind") == "hf" else None
    if model.get("kind") == "hf":
        anchor(model, "path")
    for source in (section.get("source"), split.get("public_source")):
        if isinstance(source, dict) and source.get("kind") in ("file", "images"):
            anchor(source, "path")
        if isinstance(source, dict) and written_model_path is not None and source.get("tokenizer") == written_model_path:
            source["tokenizer"] = model["path"]  # the model's folder, written as model.path is
        elif isinstance(source, dict) and "/" in str(source.get("tokenizer", "")):  # a folder, not a registered name
            anchor(source, "tokenizer")
    return data


def spec_from_dict(data: Dict[str, Any]) -> RunSpec:
    try:
        return RunSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err)) from None


def dump_yaml(spec: RunSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def json_schema() -> str:
    return json.dumps(RunSpec.model_json_schema(), indent=2)


# ------------------------------------------------------------------ error formatting
_PATTERNS = {  # the spec's name patterns, in words
    NAME_PATTERN: "use letters, digits, '_', '.' and '-', starting with a letter or digit, at most 100 characters",
    DATASET_PATTERN:
        "use letters, digits, '_', '.', ':' and '-', starting with a letter or digit, at most 200 characters",
}


def format_errors(err: ValidationError) -> str:
    """One line: ``field.path: problem (found X; allowed: ...)`` for each error, joined by '; '."""
    parts: List[str] = []
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
            allowed = ", ".join(model.model_fields) if model is not None else "see `privzo schema`"
            parts.append(f"{path}: unknown key; allowed keys here: {allowed}")
        elif kind == "union_tag_invalid":
            ctx = e.get("ctx", {})
            parts.append(f"{path}.kind: unknown kind {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}")
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
            found_text = "" if isinstance(found, (dict, list)) else f" (found {found!r})"
            parts.append(f"{path or 'spec'}: {msg}{found_text}")
    return "; ".join(dict.fromkeys(parts))


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
        names.append(str(part))
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
