"""Real Google 2011 usage series aggregated by third parties (see shared/traces/google-2011-derived/SOURCE.md).

* `job<id>_5min_sum.csv.gz` -> table `job_sums`: one row per 300-s step, sums over the job's tasks;
  the job id comes from the file name, the 18 columns from the file (floats such as `878856.0`).
* `GCD_VMs*.tar.gz` -> table `job_days`: members `GCD_VMs/vm_<job>_<k>`, each 288 lines
  `cpu_percent mem_percent` (space separated); one row per line with job_id, day_index = k, step 0..287.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.raw_schemas import GOOGLE2011_DERIVED
from pipelines.sources.base import (
    _DECODE_ERRORS,
    DEFAULT_BATCH_BYTES,
    CsvChunkParser,
    CsvTable,
    IngestError,
    ParsedBatch,
    empty_quarantine,
    iter_csv_batches,
    list_shards,
    quarantine_frame,
)

NAME = "google2011_derived"
FOLDER = "google-2011-derived"
STEPS_PER_DAY = 288  # 24 h of 5-minute points

JOB_SUMS_FILE = re.compile(r"job(\d+)_5min_sum\.csv(\.gz)?")
JOB_DAYS_FILE = re.compile(r"GCD_VMs.*\.tar\.gz")
JOB_DAYS_MEMBER = re.compile(r"vm_(\d+)_(\d+)")

_SUMS_FILE_SCHEMA = {c: t for c, t in GOOGLE2011_DERIVED["job_sums"].items() if c != "job_id"}
SUMS_SPEC = CsvTable(
    source=NAME,
    table="job_sums",
    schema=_SUMS_FILE_SCHEMA,
    mandatory=("time_s", "n_tasks"),
    non_negative=tuple(_SUMS_FILE_SCHEMA),
    # written by numpy as floats ("878856.0", "1.0"): parse as float, require whole numbers
    parse_as={c: pl.Float64 for c, t in _SUMS_FILE_SCHEMA.items() if t.is_integer()},
)
DAYS_SPEC = CsvTable(
    source=NAME,
    table="job_days",
    schema={"cpu_pct": pl.Float64, "mem_pct": pl.Float64},
    mandatory=("cpu_pct", "mem_pct"),
    non_negative=("cpu_pct", "mem_pct"),
    separator=" ",
)


class Google2011DerivedSource:
    """Derived job-level Google 2011 series under `<root>/google-2011-derived/`."""

    name = NAME
    folder = FOLDER
    tables = tuple(GOOGLE2011_DERIVED)

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Files of `table` (file name -> path, sorted)."""
        pattern = JOB_SUMS_FILE if table == "job_sums" else JOB_DAYS_FILE
        return list_shards(self, table, Path(root) / FOLDER, lambda n: pattern.fullmatch(n) is not None)

    def iter_batches(
        self, table: str, path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedBatch]:
        """Parsed batches of one file (streamed)."""
        path = Path(path)
        if table == "job_sums":
            yield from _iter_job_sums(path, batch_bytes)
        elif table == "job_days":
            yield from _iter_job_days(path, batch_bytes)
        else:
            raise IngestError(path, f"unknown {NAME} table {table!r}")


def _iter_job_sums(path: Path, batch_bytes: int) -> Iterator[ParsedBatch]:
    m = JOB_SUMS_FILE.fullmatch(path.name)
    if m is None:
        raise IngestError(path, "file name is not job<id>_5min_sum.csv[.gz]: cannot tell the job id")
    job_id = int(m.group(1))
    schema = GOOGLE2011_DERIVED["job_sums"]
    for batch in iter_csv_batches(SUMS_SPEC, path, batch_bytes):
        rows = batch.rows.with_columns(pl.lit(job_id, dtype=pl.Int64).alias("job_id")).select(list(schema))
        yield ParsedBatch(rows, batch.quarantine, batch.n_lines, batch.n_invalid_markers)


def _parse_member(tar_name: str, member: str, data: bytes) -> ParsedBatch:
    """One `vm_<job>_<k>` member -> rows (job_id, day_index, step, cpu_pct, mem_pct)."""
    schema = GOOGLE2011_DERIVED["job_days"]
    source_file = f"{tar_name}:{member}"
    m = JOB_DAYS_MEMBER.fullmatch(Path(member).name)
    if m is None or not data.strip():
        reason = "member name is not vm_<job>_<k>" if m is None else "empty member"
        q = quarantine_frame(NAME, "job_days", source_file, [0], [reason], [member])
        return ParsedBatch(pl.DataFrame(schema=schema), q, 1)
    if not data.endswith(b"\n"):
        data += b"\n"
    parser = CsvChunkParser(DAYS_SPEC, source_file, Path(source_file), keep_line_numbers=True)
    batch = parser.parse(data)
    steps = parser.last_line_numbers - 1  # line k (1-based) is step k-1 of the day
    rows = batch.rows.with_columns(
        pl.lit(int(m.group(1)), dtype=pl.Int64).alias("job_id"),
        pl.lit(int(m.group(2)), dtype=pl.Int32).alias("day_index"),
        pl.Series("step", np.asarray(steps, dtype=np.int32)),
    ).select([pl.col(c).cast(t) for c, t in schema.items()])
    return ParsedBatch(rows, batch.quarantine, batch.n_lines, 0)


def _iter_job_days(path: Path, batch_bytes: int) -> Iterator[ParsedBatch]:
    if not path.is_file():
        raise IngestError(path, "file not found")
    if path.stat().st_size == 0:
        raise IngestError(path, "empty file")
    parts: list[ParsedBatch] = []
    size = n_members = 0
    try:
        with tarfile.open(path, "r|*") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                f = tar.extractfile(info)
                assert f is not None
                data = f.read()
                n_members += 1
                parts.append(_parse_member(path.name, info.name, data))
                size += len(data)
                if size >= batch_bytes:
                    yield _merge(parts)
                    parts, size = [], 0
    except _DECODE_ERRORS as e:
        raise IngestError(path, f"cannot read tar archive: {e}") from e
    if n_members == 0:
        raise IngestError(path, "tar archive has no members")
    if parts:
        yield _merge(parts)


def _merge(parts: list[ParsedBatch]) -> ParsedBatch:
    quarantine = [p.quarantine for p in parts if p.quarantine.height]
    return ParsedBatch(
        pl.concat([p.rows for p in parts]),
        pl.concat(quarantine) if quarantine else empty_quarantine(),
        sum(p.n_lines for p in parts),
        0,
    )
