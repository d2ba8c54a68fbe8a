"""Dagster config derived from the settings dataclasses (`dataclass_config`: same names, types, defaults and
docstrings; `build()` gives the dataclass back), and a profile applied as every asset's default config
(`apply_profile`: the Materialize button, `dagster asset materialize`, the launchpad and `tvw-run` then use the same
values; an unknown op, key or bad value is a `ProfileError` naming it)."""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic
from dagster import AssetsDefinition, Config, Field
from dagster._config import Permissive, Shape, process_config, validate_config
from dagster._core.definitions.definition_config_schema import convert_user_facing_definition_config_schema

from pipelines.profiles import ProfileError, expand_shared
from pipelines.settings import config_fields, to_dataclass


class DataclassConfig(Config):
    """Base of every derived config: `build()` returns the settings dataclass it was derived from."""

    def build(self) -> Any:
        return to_dataclass(self.model_dump(), _DATACLASS_OF[type(self)])


_DATACLASS_OF: dict[type, type] = {}


@functools.cache
def dataclass_config(dc: type, name: str | None = None) -> type[Config]:
    """The Dagster `Config` with `dc`'s init fields: names, types, defaults and docstrings (one declaration)."""
    fields = {
        name: (tp, pydantic.Field(default=default, description=doc))
        for name, (tp, default, doc) in config_fields(dc, dataclass_config).items()
    }
    model = pydantic.create_model(name or dc.__name__, __base__=DataclassConfig, __doc__=dc.__doc__, **fields)
    _DATACLASS_OF[model] = dc
    return model


# --- a profile as every asset's default ---------------------------------------------------------------------


def _with_defaults(config_type: Any, values: Mapping[str, Any], where: str) -> Any:
    """`config_type` (a Shape) with `values` as its fields' defaults; ProfileError for an unknown key or a value
    Dagster would reject, naming `where.key` and what is allowed."""
    if not isinstance(values, Mapping):
        raise ProfileError(f"{where}: expected a mapping of settings, got {values!r}")
    fields = dict(config_type.fields)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ProfileError(f"{where}.{unknown[0]}: unknown setting; allowed: {', '.join(sorted(fields))}")
    new = {}
    for name, field in fields.items():
        if name not in values:
            new[name] = field
            continue
        value, here = values[name], f"{where}.{name}"
        inner = field.config_type
        if isinstance(inner, Shape | Permissive) and isinstance(value, Mapping):
            shape = _with_defaults(inner, value, here)
            default = process_config(shape, {}).value  # the nested defaults, profile values included
            new[name] = Field(shape, default_value=default, is_required=False, description=field.description)
            continue
        checked = validate_config(inner, value)
        if not checked.success:
            reason = "; ".join(e.message for e in checked.errors)
            raise ProfileError(f"{here}: {value!r} is not a valid value ({reason})")
        new[name] = Field(inner, default_value=value, is_required=False, description=field.description)
    return Shape(new, description=getattr(config_type, "description", None))


def apply_profile(assets: Iterable[AssetsDefinition], ops: Mapping, shared: Mapping | None = None) -> list:
    """Every asset whose op `ops` configures, with that configuration as its config's default (the rest as they
    are; `shared`: op -> the other ops its entry configures). ProfileError names an op no asset has, an op that takes no config, an unknown key or a bad value, and
    a value the settings dataclass itself refuses (its `__post_init__` checks, e.g. a negative k)."""
    assets, (ops, written_as) = (
        list(assets),
        expand_shared(ops, shared or {}),
    )  # an entry configuring several ops
    by_op = {a.node_def.name: a for a in assets}
    unknown = sorted(set(ops) - set(by_op))
    if unknown:
        raise ProfileError(f"ops.{unknown[0]}: no asset of that name; assets: {', '.join(sorted(by_op))}")
    out = []
    for asset in assets:
        name = asset.node_def.name
        entry = ops.get(name)
        if entry is None:
            out.append(asset)
            continue
        where = f"ops.{written_as.get(name, name)}"
        if not isinstance(entry, Mapping) or set(entry) - {"config"}:
            raise ProfileError(f"{where}: expected `config:` and nothing else, got {entry!r}")
        shape = getattr(asset.node_def.config_schema, "config_type", None)
        if shape is None or not isinstance(shape, Shape | Permissive):
            raise ProfileError(f"{where}: this asset takes no config")
        new_shape = _with_defaults(shape, entry.get("config") or {}, f"{where}.config")
        _check_dataclass(asset, entry.get("config") or {}, f"{where}.config")
        node = asset.node_def.with_replaced_properties(
            name=name, config_schema=convert_user_facing_definition_config_schema(new_shape)
        )
        out.append(
            AssetsDefinition.dagster_internal_init(**{**asset.get_attributes_dict(), "node_def": node})
        )
    return out


def config_class_of(asset: AssetsDefinition) -> type | None:
    """The `Config` class an asset's function takes as `config`, or None."""
    fn = getattr(asset.node_def, "compute_fn", None)
    fn = getattr(fn, "decorated_fn", fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an op without resolvable annotations takes no Config class
        return None
    tp = hints.get("config")
    return tp if isinstance(tp, type) and issubclass(tp, Config) else None


def _check_dataclass(asset: AssetsDefinition, values: Mapping[str, Any], where: str) -> None:
    """Build the asset's settings from its defaults and `values`, so the dataclass's own checks run now."""
    cls = config_class_of(asset)
    if cls is None or not issubclass(cls, DataclassConfig):
        return
    try:
        cls(**values).build()
    except (ValueError, TypeError, pydantic.ValidationError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ProfileError(f"{where}: {first}") from None


def resolved_config(asset: AssetsDefinition) -> dict:
    """The config an asset runs with when a run gives none: its defaults, i.e. the profile's values."""
    shape = getattr(asset.node_def.config_schema, "config_type", None)
    return {} if shape is None else dict(process_config(shape, {}).value or {})
