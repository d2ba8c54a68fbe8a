"""Settings dataclasses as configuration: their fields' docstrings, the types and values a config form gives
them, and the dataclass built back from config values. Pure Python: `assets.settings` derives Dagster configs
from these, and profiles are validated against them."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import operator
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any


@functools.cache
def attribute_docs(dc: type) -> dict[str, str]:
    """Field name -> the docstring written under it in the class body (PEP 257 attribute docstrings)."""
    docs: dict[str, str] = {}
    for klass in reversed(dc.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def config_annotation(tp: Any, nested: Callable[[type], Any]) -> Any:
    """The annotation a config model gives a dataclass field of type `tp`: tuples become lists, a nested
    dataclass becomes `nested(that dataclass)` (e.g. its own derived config)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return nested(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        converted = (
            config_annotation(inner[0], nested)
            if len(inner) == 1
            else functools.reduce(operator.or_, (config_annotation(t, nested) for t in inner))
        )
        return converted | None if type(None) in args else converted
    if origin in (tuple, list):
        items = [a for a in args if a is not Ellipsis] or [Any]
        item = items[0] if len(set(items)) == 1 else functools.reduce(operator.or_, items)
        return list[config_annotation(item, nested)]
    if origin is dict:
        return dict[args[0], config_annotation(args[1], nested)]
    return tp


def config_value(value: Any) -> Any:
    """A dataclass default as a config value (tuples as lists, dataclass instances as dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: config_value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, tuple | list):
        return [config_value(v) for v in value]
    if isinstance(value, dict):
        return {k: config_value(v) for k, v in value.items()}
    return value


def to_dataclass(values: Mapping[str, Any], dc: type) -> Any:
    """`dc` built from config values: nested mappings become the nested dataclasses, lists the declared tuples.
    The dataclass's own `__post_init__` checks run, so a bad value fails here, naming itself."""
    hints = typing.get_type_hints(dc)
    kwargs = {}
    for f in dataclasses.fields(dc):
        if f.init and f.name in values:
            kwargs[f.name] = _from_config(values[f.name], hints[f.name])
    return dc(**kwargs)


def _from_config(value: Any, tp: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else to_dataclass(value, tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _from_config(value, inner[0]) if len(inner) == 1 else value
    if origin is tuple:
        items = list(args)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_from_config(v, items[0]) for v in value)
        return tuple(_from_config(v, t) for v, t in zip(value, items, strict=False))
    if origin is list:
        return [_from_config(v, args[0]) for v in value] if args else list(value)
    if origin is dict:
        return {k: _from_config(v, args[1]) for k, v in value.items()}
    return value


def find_setting(config: Mapping[str, Any], name: str) -> Any:
    """The value of the setting `name` in a resolved config, at the top or in a nested mapping (breadth first);
    KeyError naming it when absent."""
    level = [config]
    while level:
        for mapping in level:
            if name in mapping:
                return mapping[name]
        level = [v for m in level for v in m.values() if isinstance(v, Mapping)]
    raise KeyError(f"no setting {name!r} in {sorted(config)}")


def config_fields(dc: type, nested: Callable[[type], Any]) -> dict[str, tuple[Any, Any, str | None]]:
    """Per init field of dataclass `dc`: (annotation, default, docstring) for a config model derived from it
    (`config_annotation`; a nested dataclass default becomes `nested(its class)(**values)`; `...`: required)."""
    if not dataclasses.is_dataclass(dc):
        raise TypeError(f"{dc!r} is not a dataclass")
    hints, docs, out = typing.get_type_hints(dc), attribute_docs(dc), {}
    for f in dataclasses.fields(dc):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ...
        tp = config_annotation(hints[f.name], nested)
        if default is not ...:
            default = (
                tp(**config_value(default)) if dataclasses.is_dataclass(default) else config_value(default)
            )
        out[f.name] = (tp, default, docs.get(f.name))
    return out
