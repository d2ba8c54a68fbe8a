"""Asset checks from the plain values the packages below compute: `{name: (passed, metadata)}` -> results."""

from typing import Any

import polars as pl
from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, MetadataValue

from pipelines.table_checks import table_check_docs, table_check_values


def specs(
    asset: str, docs: dict[str, str] | None = None, blocking: tuple[str, ...] = ()
) -> list[AssetCheckSpec]:
    """One spec of `asset` per check name -> description (default: its `pipelines.table_checks` entry)."""
    docs = docs or table_check_docs(asset)
    return [AssetCheckSpec(n, asset=asset, description=d, blocking=n in blocking) for n, d in docs.items()]


def results(
    values: dict[str, tuple[bool, dict[str, Any]]],
    asset: str | None = None,
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR,
) -> list[AssetCheckResult]:
    """One result per check name -> (passed, metadata); lists and mappings become JSON metadata."""
    return [
        AssetCheckResult(
            check_name=name,
            passed=bool(passed),
            severity=severity,
            metadata={k: MetadataValue.json(v) if isinstance(v, list | dict) else v for k, v in meta.items()},
            **({"asset_key": asset} if asset else {}),
        )
        for name, (passed, meta) in values.items()
    ]


def table_results(asset: str, df: pl.DataFrame, may_be_empty: bool | None = None) -> list[AssetCheckResult]:
    """The results of `asset`'s generic table check (`pipelines.table_checks.TABLE_CHECKS`)."""
    return results(table_check_values(asset, df, may_be_empty), asset)
