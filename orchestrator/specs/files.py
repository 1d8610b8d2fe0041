"""Reading DAG spec files: YAML or JSON, one DAG or a list of DAGs per file."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


# libyaml's parser when PyYAML was built with it: a 10,000-task file parses in a fraction of
# the pure-Python parser's time. Same resolver and constructors either way.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecLoader(_SAFE_LOADER):  # type: ignore[valid-type, misc]  # a base chosen at import: the C loader when built
    """SafeLoader that keeps date-times as the text written and rejects duplicate keys.

    Dates stay strings so a deadline's `datetime` is kept exactly as written (and
    naive date-times are read in the DAG's timezone, not as UTC); a duplicate key
    would otherwise silently win over the first.
    """


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: SpecLoader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    seen: dict[object, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            first = seen.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:
            continue  # an unhashable key: construct_mapping reports it
        if first != key_node.start_mark.line + 1:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark
            )
    return loader.construct_mapping(node)


SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class RawDag:
    """One DAG as read from a file, not yet validated."""

    source: str  # the file, as the user named it
    index: int  # position in the file
    data: object


class FileError(Exception):
    """A file that cannot be read or parsed; the message names the file (and line)."""


def spec_paths(path: Path) -> list[Path]:
    """`path` itself, or every spec file directly in it when it is a directory (sorted)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SPEC_SUFFIXES)
    if not path.exists():
        raise FileError(f"{path}: no such file or directory")
    return [path]


def read_spec_file(path: Path) -> list[RawDag]:
    """The DAGs in one file; raises FileError naming the file and, for a syntax error, the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FileError(f"{path}: cannot read: {exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FileError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from exc
        except RecursionError as exc:
            raise FileError(f"{path}: invalid JSON: nested too deeply") from exc
    else:
        try:
            data = yaml.load(text, Loader=SpecLoader)
        except yaml.YAMLError as exc:
            raise FileError(f"{path}: {_yaml_problem(exc)}") from exc
        except RecursionError as exc:
            raise FileError(f"{path}: invalid YAML: nested too deeply") from exc
    if data is None:
        raise FileError(f"{path}: holds no DAG")
    items = data if isinstance(data, list) else [data]
    return [RawDag(source=str(path), index=i, data=item) for i, item in enumerate(items)]


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"line {mark.line + 1}: invalid YAML: {problem}"
    return f"invalid YAML: {problem}"
