"""Trace sources, one module per public trace, listed in one registry (`SOURCES`)."""

from __future__ import annotations

from pipelines.sources.alibaba2018 import Alibaba2018Source
from pipelines.sources.base import IngestError, ParsedBatch, TraceSource
from pipelines.sources.bitbrains import BitbrainsSource
from pipelines.sources.google2011 import Google2011Source
from pipelines.sources.google2011_derived import Google2011DerivedSource

SOURCES: dict[str, TraceSource] = {
    s.name: s for s in (Google2011Source(), Alibaba2018Source(), Google2011DerivedSource(), BitbrainsSource())
}
"""source name -> source object (the source name is a Dagster partition key)."""

__all__ = ["SOURCES", "IngestError", "ParsedBatch", "TraceSource"]
