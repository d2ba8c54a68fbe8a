"""Real Google 2011 usage series aggregated by third parties (see shared/traces/google-2011-derived/SOURCE.md).

Files (names in `EXPECTED_FILES`; anything else in the folder is reported as unread, never silently skipped):

* `job<id>_5min_sum.csv[.gz]`, or the publisher's `data_resource_JobId_<id>_5minutes.csv[.gz]` /
  `data_resource_usage_fiveMinutes_<id>.csv[.gz]` -> table `job_sums`: one row per 300-s step, sums over the
  job's tasks; the job id comes from the file name, the 18 columns from the file (floats such as `878856.0`).
  One file per job: a second name for the same job id is not read (reported).
* `GCD_VMs*.tar.gz` / `.tgz` / `.tar`, or the unpacked `GCD_VMs/` folder (one shard, read instead of any
  tarball beside it) -> table `job_days`: members / files `vm_<job>_<k>`, each 288 lines
  `cpu_percent mem_percent` (space separated); one row per line with job_id, day_index = k, step 0..287.

Every numeric column has a valid range (`sums_range`, `DAYS_SPEC`); a value outside it, NaN or infinite,
sends its line to the quarantine with the reason.

Canonical mapping:
  * A workload is a whole job: what the GCD_VMs publisher packs as one VM, and the only unit both tables
    share (job_days carry no task count, so no per-task mean can be formed for them).
    job_sums -> one workload `"job<job_id>"`; job_days -> one workload per (job, day) `"<job_id>_d<k>"`
    (contiguity of the days of a job is not verified, so each day stands alone).
  * Usage is the job's total over its tasks, as a fraction of one machine (Google's normalisation: 1.0 = the
    largest machine of the cell), the same scale in both tables:
    job_sums rows -> t = time_s, `cpu_frac = cpu_rate_sum_frac`, `mem_frac = canonical_mem_sum_frac` (a row
    with n_tasks <= 0 has no task running: counted as null usage, a gap);
    job_days rows -> `bin_start_s = (k - 1) * 86400 + step * 300` (bins unique per workload),
    `cpu_frac = cpu_pct / 100`, `mem_frac = mem_pct / 100` (the publisher's job-level sums in percent).
  * A job larger than one machine keeps its real total: job 6336594489 (about 20,000 tasks) sums to about 80
    machines of CPU (up to 210), and a few job-days exceed one machine of memory (up to 1.31 in GCD_VMs.dev). Such bins
    are kept in `core__usage`, counted per resource by the `usage_within_one_machine` check (WARN), scaled
    with the rest of the source by the job-sequence builder, and clipped to a machine and counted by the
    simulator (`oversize="clip"`).
  * Workload times from the usage bins: start = first bin, end = last bin + 300 s, `n_usage_records` = raw rows.
    No requests, priority, class or machine; `final_state = "running"`, never partial.
  * Long-running: 6000 contiguous 5-minute bins, as for the Google trace they come from.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.schemas import BIN_SECONDS, empty_frame
from pipelines.sources.base import (
    _DECODE_ERRORS,
    DEFAULT_BATCH_BYTES,
    CsvChunkParser,
    CsvTable,
    IngestError,
    ParsedBatch,
    check_table,
    empty_quarantine,
    iter_csv_batches,
    list_shards,
    quarantine_frame,
)
from pipelines.sources.mapping import (
    LongRunningRule,
    TimeChunks,
    UsageMapping,
    bad_reason,
    count_reasons,
    mean_per_bin,
)

NAME = "google2011_derived"
FOLDER = "google-2011-derived"
STEPS_PER_DAY = 288  # 24 h of 5-minute points

I64, I32, F64 = pl.Int64, pl.Int32, pl.Float64

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # job<id>_5min_sum.csv.gz: per-job sums over all its tasks, every 300 s. job_id comes from the
    # file name; the other 18 columns are the file's, in order (SOURCE.md). cpi_sum / mai_sum are
    # sums over tasks: divide by n_tasks for a mean.
    "job_sums": {
        "job_id": I64,
        "time_s": I64,
        "n_tasks": I64,
        "n_machines": I64,
        "cpu_rate_sum_frac": F64,
        "canonical_mem_sum_frac": F64,
        "assigned_mem_sum_frac": F64,
        "unmapped_page_cache_sum_frac": F64,
        "total_page_cache_sum_frac": F64,
        "max_mem_sum_frac": F64,
        "disk_io_time_sum_frac": F64,
        "local_disk_sum_frac": F64,
        "max_cpu_rate_sum_frac": F64,
        "max_disk_io_time_sum_frac": F64,
        "cpi_sum": F64,
        "mai_sum": F64,
        "sample_portion_sum": F64,
        "aggregation_type_sum": F64,
        "sampled_cpu_rate_sum_frac": F64,
    },
    # GCD_VMs/vm_<job>_<k>: 288 five-minute points of one job-day, percent of a machine
    "job_days": {
        "job_id": I64,
        "day_index": I32,
        "step": I32,
        "cpu_pct": F64,
        "mem_pct": F64,
    },
}
"""Raw tables; `_frac` as in Google 2011 (fraction of the largest machine), `_pct` percent of a machine."""

_SUM = "sum over the job's tasks of their {}"
_FRAC = "fraction of the largest machine of the 2011 cell"

COLUMN_DOCS: dict[str, dict[str, str]] = {
    "job_sums": {
        "job_id": "Google 2011 job id, from the file name",
        "time_s": "start of the 300-s step, seconds of Google 2011 trace time",
        "n_tasks": "task_usage records of the job whose window spans the step's time (0: no task running)",
        "n_machines": "machine ids of those records, counted",
        "cpu_rate_sum_frac": _SUM.format(f"mean CPU rate, {_FRAC}"),
        "canonical_mem_sum_frac": _SUM.format(f"canonical memory usage, {_FRAC}"),
        "assigned_mem_sum_frac": _SUM.format(f"assigned memory, {_FRAC}"),
        "unmapped_page_cache_sum_frac": _SUM.format(f"unmapped page cache, {_FRAC}"),
        "total_page_cache_sum_frac": _SUM.format(f"total page cache, {_FRAC}"),
        "max_mem_sum_frac": _SUM.format(f"largest memory usage in the window, {_FRAC}"),
        "disk_io_time_sum_frac": _SUM.format("mean disk I/O time"),
        "local_disk_sum_frac": _SUM.format(f"local disk space used, {_FRAC}"),
        "max_cpu_rate_sum_frac": _SUM.format(f"largest CPU rate in the window, {_FRAC}"),
        "max_disk_io_time_sum_frac": _SUM.format("largest disk I/O time in the window"),
        "cpi_sum": _SUM.format("cycles per instruction (divide by n_tasks for a mean)"),
        "mai_sum": _SUM.format("memory accesses per instruction (divide by n_tasks for a mean)"),
        "sample_portion_sum": _SUM.format("portion of the window measured"),
        "aggregation_type_sum": _SUM.format("aggregation flags (1: maximums summed over sub-containers)"),
        "sampled_cpu_rate_sum_frac": _SUM.format(f"CPU rate in a random 1-second sample, {_FRAC}"),
    },
    "job_days": {
        "job_id": "Google 2011 job id, from the member name vm_<job>_<k>",
        "day_index": "k of the member name: presumably the day of the job's series (contiguity not verified)",
        "step": "5-minute point of the day, 0..287 (the member's line)",
        "cpu_pct": "CPU usage of the whole job, % of one machine (the publisher's sum over its tasks, filtered to "
        "5-90 %)",
        "mem_pct": "memory usage of the whole job, % of one machine",
    },
}
"""Raw table -> column -> what it holds (the publishers' files, shared/traces/google-2011-derived/SOURCE.md)."""

JOB_SUMS_FILES = (
    re.compile(r"job(\d+)_5min_sum\.csv(\.gz)?"),
    re.compile(r"data_resource_JobId_(\d+)_5minutes\.csv(\.gz)?"),
    re.compile(r"data_resource_usage_fiveMinutes_(\d+)\.csv(\.gz)?"),
)
"""Names of a job_sums file, in order of preference: the project's, the publisher's (thangbk2209/
google_cluster_analysis `results/data_resource_JobId_<id>_5minutes.csv`), and the publisher's other naming
scheme at 5 minutes (`data_resource_usage_<step>_<id>.csv`). The job id is group 1."""
JOB_DAYS_FILE = re.compile(r"GCD_VMs[^/]*\.(tar\.gz|tgz|tar)")
JOB_DAYS_FOLDER = re.compile(r"GCD_VMs[^/]*")
JOB_DAYS_MEMBER = re.compile(r"vm_(\d+)_(\d+)")

EXPECTED_FILES = {
    "job_sums": "one headerless 18-column 5-minute file per job, named job<id>_5min_sum.csv[.gz], "
    "data_resource_JobId_<id>_5minutes.csv[.gz] or data_resource_usage_fiveMinutes_<id>.csv[.gz] "
    "(one file per job id; other steps than 5 minutes are not read)",
    "job_days": "the GCD_VMs*.tar.gz / .tgz / .tar tarball, or its unpacked GCD_VMs/ folder of vm_<job>_<k> "
    "files (the folder is read instead of any tarball beside it)",
}
"""Table -> the file names and layout `discover` accepts (shown when a file in the folder matches none)."""

CELL_MACHINES = 13_000
"""Upper bound of a whole-job sum in machines: the 2011 cell has about 12,500 machines (trace-schemas.md), so no
job can use more (job 6336594489, the largest, peaks at 210 machines of CPU and 1,709 of 1-second CPU peaks)."""
MAX_TASKS = 1_000_000
"""Upper bound of a job's task (and machine) count in one step (the largest job of the trace has about 40,000)."""
MAX_TIME_S = 40 * 86_400
"""Latest valid step time: the trace covers 29 days from 600 s."""


def sums_range(column: str) -> tuple[float | None, float | None]:
    """The valid range of a job_sums column: sums of fractions of a machine on [0, CELL_MACHINES], counts on
    [0, MAX_TASKS], times on [0, MAX_TIME_S]; cpi / mai sums and the others non-negative. Floats also finite."""
    if column.endswith("_sum_frac"):
        return 0, CELL_MACHINES
    if column in ("n_tasks", "n_machines"):
        return 0, MAX_TASKS
    if column == "time_s":
        return 0, MAX_TIME_S
    return 0, None


_SUMS_FILE_SCHEMA = {c: t for c, t in SCHEMAS["job_sums"].items() if c != "job_id"}
SUMS_SPEC = CsvTable(
    source=NAME,
    table="job_sums",
    schema=_SUMS_FILE_SCHEMA,
    mandatory=("time_s", "n_tasks"),
    ranges={c: sums_range(c) for c in _SUMS_FILE_SCHEMA},
    # written by numpy as floats ("878856.0", "1.0"): parse as float, require whole numbers
    parse_as={c: pl.Float64 for c, t in _SUMS_FILE_SCHEMA.items() if t.is_integer()},
)
DAYS_SPEC = CsvTable(
    source=NAME,
    table="job_days",
    schema={"cpu_pct": pl.Float64, "mem_pct": pl.Float64},
    mandatory=("cpu_pct", "mem_pct"),
    # whole-job percent of one machine: above 100 for jobs larger than a machine (mem up to 131 in GCD_VMs.dev)
    ranges={"cpu_pct": (0, 100 * CELL_MACHINES), "mem_pct": (0, 100 * CELL_MACHINES)},
    separator=" ",
)


# ---------------------------------------------------------------- canonical mapping


def _job_days_bin() -> pl.Expr:
    """bin_start_s of a job_days row: day k starts at (k - 1) days, one step per 5-minute bin."""
    return (pl.col("day_index").cast(pl.Int64) - 1) * 86_400 + pl.col("step").cast(pl.Int64) * BIN_SECONDS


def usage_rows(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Raw rows of both tables as (workload_id, bin_start_s, cpu_frac, mem_frac), before checks: whole-job
    totals as fractions of one machine (module docstring)."""
    parts = []
    if "job_sums" in raw:
        running = pl.col("n_tasks") > 0  # no task recorded in the step: the job is not running (a gap)
        parts.append(
            raw["job_sums"].select(
                pl.format("job{}", "job_id").alias("workload_id"),
                (pl.col("time_s") // BIN_SECONDS * BIN_SECONDS).cast(pl.Int64).alias("bin_start_s"),
                pl.when(running).then(pl.col("cpu_rate_sum_frac")).alias("cpu_frac"),
                pl.when(running).then(pl.col("canonical_mem_sum_frac")).alias("mem_frac"),
            )
        )
    if "job_days" in raw:
        parts.append(
            raw["job_days"].select(
                pl.format("{}_d{}", "job_id", "day_index").alias("workload_id"),
                _job_days_bin().alias("bin_start_s"),
                (pl.col("cpu_pct") / 100).alias("cpu_frac"),
                (pl.col("mem_pct") / 100).alias("mem_frac"),
            )
        )
    if not parts:
        return empty_frame(
            {
                "workload_id": pl.String,
                "bin_start_s": pl.Int64,
                "cpu_frac": pl.Float64,
                "mem_frac": pl.Float64,
            }
        ).lazy()
    return pl.concat(parts)


def build_workloads(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """One workload per job (job_sums) or job-day (job_days) -> WORKLOADS columns."""
    return (
        usage_rows(raw)
        .group_by("workload_id")
        .agg(
            pl.col("bin_start_s").min().cast(pl.Float64).alias("start_time_s"),
            (pl.col("bin_start_s").max() + BIN_SECONDS).cast(pl.Float64).alias("end_time_s"),
            pl.len().cast(pl.Int64).alias("n_usage_records"),
        )
        .with_columns(
            pl.lit(NAME).alias("source"),
            pl.lit(None, pl.String).alias("machine_id"),
            pl.lit(None, pl.Float64).alias("cpu_request_frac"),
            pl.lit(None, pl.Float64).alias("mem_request_frac"),
            pl.lit(None, pl.Int32).alias("priority"),
            pl.lit(None, pl.Int32).alias("scheduling_class"),
            pl.lit("running").alias("final_state"),
            pl.lit(False).alias("is_partial"),
        )
    )


def build_bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Both tables -> (mean per workload and 5-minute bin, USAGE_COUNTS of the rows read)."""
    rows = usage_rows(raw).with_columns(
        bad_reason(pl.col("cpu_frac"), pl.col("mem_frac")).alias("bad_reason")
    )
    bins = rows.filter(pl.col("bad_reason").is_null()).pipe(mean_per_bin, NAME)
    return bins, count_reasons(rows, NAME)


USAGE_MAPPING = UsageMapping(
    build_bins,
    None,
    {"job_sums": (pl.col("time_s"), 1), "job_days": (_job_days_bin(), 1)},
    chunking=TimeChunks(30 * 24 * 3600),
)
"""Either table (or both) binned; chunks of 30 days of trace time filter on the row's time (the derived series
are small: a few chunks in all)."""


class Google2011DerivedSource:
    """Derived job-level Google 2011 series under `<root>/google-2011-derived/`."""

    name = NAME
    folder = FOLDER
    tables = tuple(SCHEMAS)
    schemas = SCHEMAS
    column_docs = COLUMN_DOCS
    long_running = LongRunningRule("contiguous_bins", 6000)
    usage = USAGE_MAPPING

    expected_files = EXPECTED_FILES

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Shards of `table`: file (or unpacked GCD_VMs folder) name -> path, sorted (names in EXPECTED_FILES)."""
        folder = Path(root) / FOLDER
        if table == "job_sums":
            return _discover_job_sums(list_shards(self, table, folder, lambda n: job_sums_id(n) is not None))
        check_table(self, table)
        unpacked = _job_days_folders(folder)
        if unpacked:
            return unpacked
        return list_shards(self, table, folder, lambda n: JOB_DAYS_FILE.fullmatch(n) is not None)

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

    def workloads(self, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
        """The WORKLOADS columns of every job and job-day (rules in the module docstring)."""
        return build_workloads(raw)


def job_sums_id(name: str) -> int | None:
    """The job id in a job_sums file name (any of JOB_SUMS_FILES), None when the name is none of them."""
    for pattern in JOB_SUMS_FILES:
        m = pattern.fullmatch(name)
        if m is not None:
            return int(m.group(1))
    return None


def _discover_job_sums(found: dict[str, Path]) -> dict[str, Path]:
    """One file per job id: of two names for the same job, the one earlier in JOB_SUMS_FILES (then by name)
    is read; the other stays in the folder unread, and is reported as such (`find_unread_files`)."""
    rank = {n: next(i for i, p in enumerate(JOB_SUMS_FILES) if p.fullmatch(n)) for n in found}
    chosen: dict[int, str] = {}
    for name in sorted(found, key=lambda n: (rank[n], n)):
        chosen.setdefault(job_sums_id(name), name)
    return {n: found[n] for n in sorted(chosen.values())}


def _job_days_folders(folder: Path) -> dict[str, Path]:
    """Unpacked GCD_VMs* folders (those holding at least one vm_<job>_<k> file): folder name -> path."""
    if not folder.is_dir():
        return {}
    return {
        p.name: p
        for p in sorted(folder.iterdir())
        if p.is_dir()
        and JOB_DAYS_FOLDER.fullmatch(p.name)
        and any(JOB_DAYS_MEMBER.fullmatch(f.name) for f in p.iterdir())
    }


def _iter_job_sums(path: Path, batch_bytes: int) -> Iterator[ParsedBatch]:
    job_id = job_sums_id(path.name)
    if job_id is None:
        raise IngestError(path, f"file name is not a job_sums name ({EXPECTED_FILES['job_sums']}): no job id")
    schema = SCHEMAS["job_sums"]
    for batch in iter_csv_batches(SUMS_SPEC, path, batch_bytes):
        rows = batch.rows.with_columns(pl.lit(job_id, dtype=pl.Int64).alias("job_id")).select(list(schema))
        yield ParsedBatch(rows, batch.quarantine, batch.n_lines, batch.n_invalid_markers)


def _parse_member(source_file: str, member: str, data: bytes) -> ParsedBatch:
    """One `vm_<job>_<k>` member (of a tarball or an unpacked folder) -> rows (job_id, day_index, step,
    cpu_pct, mem_pct); a member with another name, or empty, is one quarantine row. `source_file` names it
    in the quarantine (`<tarball>:<member>` or `<folder>/<file>`)."""
    schema = SCHEMAS["job_days"]
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
    """Batches of about `batch_bytes` of member text, from a tarball (streamed) or an unpacked folder."""
    members = _folder_members(path) if path.is_dir() else _tar_members(path)
    parts: list[ParsedBatch] = []
    size = 0
    for source_file, member, data in members:
        parts.append(_parse_member(source_file, member, data))
        size += len(data)
        if size >= batch_bytes:
            yield _merge(parts)
            parts, size = [], 0
    if parts:
        yield _merge(parts)


def _folder_members(path: Path) -> Iterator[tuple[str, str, bytes]]:
    """(`<folder>/<file>`, file name, bytes) of every entry of an unpacked GCD_VMs folder, sorted by name; a
    subfolder is passed on as an empty member (quarantined: not a vm_<job>_<k> file)."""
    entries = sorted(path.iterdir())
    if not entries:
        raise IngestError(path, "empty folder (expected vm_<job>_<k> files)")
    for p in entries:
        yield f"{path.name}/{p.name}", p.name, p.read_bytes() if p.is_file() else b""


def _tar_members(path: Path) -> Iterator[tuple[str, str, bytes]]:
    """(`<tarball>:<member>`, member name, bytes) of every regular member, streamed."""
    if not path.is_file():
        raise IngestError(path, "file not found")
    if path.stat().st_size == 0:
        raise IngestError(path, "empty file")
    n_members = 0
    try:
        with tarfile.open(path, "r|*") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                f = tar.extractfile(info)
                assert f is not None
                n_members += 1
                yield f"{path.name}:{info.name}", info.name, f.read()
    except _DECODE_ERRORS as e:
        raise IngestError(path, f"cannot read tar archive: {e}") from e
    if n_members == 0:
        raise IngestError(path, "tar archive has no members")


def _merge(parts: list[ParsedBatch]) -> ParsedBatch:
    quarantine = [p.quarantine for p in parts if p.quarantine.height]
    return ParsedBatch(
        pl.concat([p.rows for p in parts]),
        pl.concat(quarantine) if quarantine else empty_quarantine(),
        sum(p.n_lines for p in parts),
        0,
    )
