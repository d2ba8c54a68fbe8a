"""Typed schemas of the raw tables, one per (source, table), in the trace's own column order.

Each source module owns its raw schemas (`TraceSource.schemas`); this module gathers them from the registry.
Names carry units: `_us` microseconds of trace time (Google: since 600 s before the trace start,
special values 0 and 2**63-1 kept as they are), `_s` seconds, `_frac` Google's normalised
fraction of the largest machine, `_pct` percentages, `_centicores` Alibaba's "100 = 1 core",
`_mhz`, `_kb`, `_kb_per_s` Bitbrains' units. Documented invalid markers (Alibaba -1 / 101) become null.
"""

from __future__ import annotations

import polars as pl

from pipelines.sources import SOURCES
from pipelines.sources.alibaba2018 import SCHEMAS as ALIBABA2018
from pipelines.sources.google2011 import SCHEMAS as GOOGLE2011
from pipelines.sources.google2011_derived import SCHEMAS as GOOGLE2011_DERIVED

__all__ = ["ALIBABA2018", "GOOGLE2011", "GOOGLE2011_DERIVED", "RAW_SCHEMAS"]

RAW_SCHEMAS: dict[str, dict[str, dict[str, pl.DataType]]] = {name: s.schemas for name, s in SOURCES.items()}
"""source name -> table name -> polars schema."""
