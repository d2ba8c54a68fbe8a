"""Alibaba cluster-trace-v2018: one headerless CSV per table, shipped as `<table>.tar.gz`.

Times are seconds from the start of the sampled period (container_usage rows may start on day 2,
alibaba/clusterdata issue #52: kept as they are). Normalised values are on [0, 100]; -1 and 101
are the documented invalid markers and become null (counted, not quarantined). Raw column units: `_s`
seconds, `_pct` percentages on [0, 100], `_centicores` "100 = 1 core". Every numeric column has a valid range
(`valid_range`); a value outside it, NaN or infinite, sends its line to the quarantine with the reason.

Canonical mapping (online containers):
  * Workload = container, `workload_id = container_id`; union of container_meta and container_usage ids.
    Usage rows with an empty/null container_id are not a workload (counted as `rows_dropped_no_workload_id`).
  * `start_time_s` / `end_time_s` = first / last usage sample time (samples are instants on a 10 s grid).
  * Requests from the container's last container_meta row with a value:
    `cpu_request_frac = cpu_request_centicores / 100 / cpu_num` (cpu_num of the container's machine from
    machine_meta, 96 when the machine is unknown), `mem_request_frac = mem_size_pct / 100`.
  * `final_state` from the last container_meta status: stopped -> finished (the trace does not tell a
    normal stop from a kill), started -> running, allocated -> running (resources held at the trace end);
    no meta or another status -> unknown. No priority or scheduling class (null).
  * `machine_id`: from container_meta, else the last usage sample's machine.
  * `is_partial`: the container has no container_meta row (its life is not recorded). Cut records are not
    detected: container samples are irregular (median gap ~450 s, gaps of hours), so a last sample long
    before the last meta snapshot is normal; gaps are left to the long-running rule.
  * Usage: t = sample time; the samples (irregular, on a 10 s grid) of a bin are averaged with equal weights,
    `n_samples` = samples in the bin. cpu_util_pct is read as percent of the container's own cpu_request
    (100 = one core): `cpu_frac = cpu_util_pct/100 * cpu_request_centicores/100 / cpu_num` (cpu_num of the
    container's machine from machine_meta; 96 when the machine is unknown, counted as
    `workloads_default_cpu_num`); mem_util_pct as percent of the container's mem_size_pct:
    `mem_frac = mem_util_pct/100 * mem_size_pct/100`. JUDGEMENT CALL: a container without container_meta (or
    with no request recorded) is kept and its percentages are read as percent of the machine
    (`cpu_util_pct/100`, `mem_util_pct/100`), counted as `workloads_without_meta`.
  * Long-running: at least 2000 records (`LONG_RUNNING`, the `observed_bins` rule): TVW-RL's wording for Alibaba
    is "at least 2000 timestamped resource usage records", with no contiguity asked (unlike Google's "6000
    continuous" records). A record is counted per 5-minute bin with at least one sample (several samples in
    one bin are one record of the 5-minute series), wherever the gaps are: a container with a 4-hour hole is
    kept if it has enough records. The contiguous rule would keep no Alibaba container of the real trace at
    2000 (samples are irregular: the longest gap-free 5-minute run of the head's containers is 5-10 bins).
    Downstream still uses the longest gap-free run as the workload's window (`n_run_bins`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from pipelines.schemas import BIN_SECONDS, empty_frame
from pipelines.sources.base import (
    DEFAULT_BATCH_BYTES,
    CsvTable,
    IngestError,
    ParsedBatch,
    iter_csv_batches,
    list_shards,
)
from pipelines.sources.mapping import (
    LongRunningRule,
    UsageMapping,
    WorkloadChunks,
    bad_reason,
    count_reasons,
    counts_frame,
    last_value,
    mean_per_bin,
)

NAME = "alibaba2018"
FOLDER = "alibaba-2018"

I64, I32, F64, STR = pl.Int64, pl.Int32, pl.Float64, pl.String

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "machine_meta": {
        "machine_id": STR,
        "time_s": I64,
        "failure_domain_1": I64,
        "failure_domain_2": STR,
        "cpu_num": I32,
        "mem_size_pct": F64,
        "status": STR,
    },
    "machine_usage": {
        "machine_id": STR,
        "time_s": I64,
        "cpu_util_pct": F64,
        "mem_util_pct": F64,
        "mem_gps_pct": F64,
        "mkpi": F64,
        "net_in_pct": F64,
        "net_out_pct": F64,
        "disk_io_pct": F64,
    },
    "container_meta": {
        "container_id": STR,
        "machine_id": STR,
        "time_s": I64,
        "app_du": STR,
        "status": STR,
        "cpu_request_centicores": F64,
        "cpu_limit_centicores": F64,
        "mem_size_pct": F64,
    },
    "container_usage": {
        "container_id": STR,
        "machine_id": STR,
        "time_s": I64,
        "cpu_util_pct": F64,
        "mem_util_pct": F64,
        "cpi": F64,
        "mem_gps_pct": F64,
        "mpki": F64,
        "net_in_pct": F64,
        "net_out_pct": F64,
        "disk_io_pct": F64,
    },
    "batch_task": {
        "task_name": STR,
        "instance_num": I64,
        "job_name": STR,
        "task_type": STR,
        "status": STR,
        "start_time_s": I64,
        "end_time_s": I64,
        "plan_cpu_centicores": F64,
        "plan_mem_pct": F64,
    },
    "batch_instance": {
        "instance_name": STR,
        "task_name": STR,
        "job_name": STR,
        "task_type": STR,
        "status": STR,
        "start_time_s": I64,
        "end_time_s": I64,
        "machine_id": STR,
        "seq_no": I64,
        "total_seq_no": I64,
        "cpu_avg_centicores": F64,
        "cpu_max_centicores": F64,
        "mem_avg_pct": F64,
        "mem_max_pct": F64,
    },
}
"""Raw tables, in schema.txt's column order."""

_TIME = "seconds from the start of the sampled period (0)"
_NORM = "normalised to 0..100; the trace's invalid markers -1 and 101 are read as null"
_CORES = "100 = one core"
_MACHINE = "machine id (a uid such as m_1)"
_JOB_STATUS = "status of the {} (e.g. Terminated, Running, Failed, Waiting)"

COLUMN_DOCS: dict[str, dict[str, str]] = {
    "machine_meta": {
        "machine_id": _MACHINE,
        "time_s": f"time of the snapshot, {_TIME}",
        "failure_domain_1": "first-level failure domain of the machine, an enumerated integer",
        "failure_domain_2": "second-level failure domain of the machine, a string",
        "cpu_num": "CPU cores of the machine (96 throughout the trace)",
        "mem_size_pct": f"memory size of the machine, {_NORM}",
        "status": "state of the machine (e.g. USING, IMPORT_INSTALLING)",
    },
    "machine_usage": {
        "machine_id": _MACHINE,
        "time_s": f"sample time, {_TIME}; samples lie on a 10-s grid at irregular intervals (median about a "
        "minute per machine)",
        "cpu_util_pct": "CPU utilisation of the machine, % (0..100)",
        "mem_util_pct": "memory utilisation of the machine, % (0..100)",
        "mem_gps_pct": f"memory bandwidth, {_NORM}; often empty",
        "mkpi": "cache misses per thousand instructions (the trace spells it mkpi here, mpki in container_usage); "
        "often empty",
        "net_in_pct": f"incoming network traffic, {_NORM}",
        "net_out_pct": f"outgoing network traffic, {_NORM}",
        "disk_io_pct": f"disk I/O, {_NORM}",
    },
    "container_meta": {
        "container_id": "container id (an online-service container, e.g. c_1)",
        "machine_id": "machine the container is on",
        "time_s": f"time of the snapshot, {_TIME}",
        "app_du": "application deployment unit: containers sharing it belong to one application",
        "status": "state of the container: allocated, started or stopped",
        "cpu_request_centicores": f"CPU the container requests, {_CORES} (e.g. 400, 800, 1600)",
        "cpu_limit_centicores": f"CPU limit of the container, {_CORES}",
        "mem_size_pct": f"memory size of the container, {_NORM}",
    },
    "container_usage": {
        "container_id": "container id; rows with an empty id are quarantined",
        "machine_id": "machine the container is on",
        "time_s": f"sample time, {_TIME}; irregular intervals on a 10-s grid (median about 450 s per container), "
        "some containers from day 2 to 9 (kept as recorded)",
        "cpu_util_pct": "CPU utilisation of the container, % (presumably of its CPU request; the schema states "
        "no unit)",
        "mem_util_pct": "memory utilisation of the container, % (presumably of its memory size)",
        "cpi": "cycles per instruction",
        "mem_gps_pct": f"memory bandwidth, {_NORM}",
        "mpki": "cache misses per thousand instructions",
        "net_in_pct": f"incoming network traffic, {_NORM}",
        "net_out_pct": f"outgoing network traffic, {_NORM}",
        "disk_io_pct": f"disk I/O, {_NORM}",
    },
    "batch_task": {
        "task_name": "task name; it encodes the job's DAG (M5_3_4: task 5 depends on tasks 3 and 4; a random "
        "name is an independent task)",
        "instance_num": "instances of the task",
        "job_name": "batch job the task belongs to",
        "task_type": "task type (one of 12)",
        "status": _JOB_STATUS.format("task"),
        "start_time_s": f"start of the task, {_TIME}",
        "end_time_s": f"end of the task, {_TIME}",
        "plan_cpu_centicores": f"CPU planned for each instance, {_CORES}",
        "plan_mem_pct": f"memory planned for each instance, {_NORM}",
    },
    "batch_instance": {
        "instance_name": "instance name (one run of a task on a machine)",
        "task_name": "task the instance belongs to",
        "job_name": "batch job the instance belongs to",
        "task_type": "task type (one of 12)",
        "status": _JOB_STATUS.format("instance"),
        "start_time_s": f"start of the instance, {_TIME}",
        "end_time_s": f"end of the instance, {_TIME}",
        "machine_id": "machine the instance ran on",
        "seq_no": "attempt number of this instance",
        "total_seq_no": "attempts of the instance in all",
        "cpu_avg_centicores": f"mean CPU the instance used, {_CORES}",
        "cpu_max_centicores": f"largest CPU the instance used, {_CORES}",
        "mem_avg_pct": f"mean memory the instance used, {_NORM}",
        "mem_max_pct": f"largest memory the instance used, {_NORM}",
    },
}
"""Raw table -> column -> what it holds (`schema.txt` of cluster-trace-v2018, trace-schemas.md section 3)."""


MAX_TIME_S = 31 * 86_400
"""Latest valid time stamp: the trace covers 8 days from 0 s and container_usage runs to day 9 (issue #52: up to
777,590 s); a month bounds that with room, and keeps a value such as 1e300 out of an int64 column."""
MAX_CPU_NUM = 1024
"""Most cores a machine can have (every machine of the trace has 96)."""
MAX_CENTICORES = 100 * MAX_CPU_NUM
"""Largest CPU request, limit or use in centicores (100 = 1 core): a whole machine of the largest size."""


def valid_range(column: str) -> tuple[float | None, float | None]:
    """The valid range of a numeric raw column, from its unit (schema.txt, trace_2018.md): percentages and
    normalised values on [0, 100] (the invalid markers -1 and 101 are let through, then nulled and counted),
    times on [0, MAX_TIME_S], centicores on [0, MAX_CENTICORES], cpu_num on [1, MAX_CPU_NUM]; counters and
    ratios (instance_num, seq_no, cpi, mkpi / mpki, failure_domain_1) non-negative. Every float is also finite."""
    if column.endswith("_pct"):
        return 0, 100
    if column.endswith("_s"):
        return 0, MAX_TIME_S
    if column.endswith("_centicores"):
        return 0, MAX_CENTICORES
    if column == "cpu_num":
        return 1, MAX_CPU_NUM
    return 0, None


def _spec(table: str, mandatory: tuple[str, ...], **kw) -> CsvTable:
    schema = SCHEMAS[table]
    # time stamps are "double" in schema.txt for the usage tables: parse as float, require integers
    parse_as = {c: pl.Float64 for c, t in schema.items() if t.is_integer() and c.endswith("_s")}
    return CsvTable(
        source=NAME,
        table=table,
        schema=schema,
        mandatory=mandatory,
        ranges={c: valid_range(c) for c, t in schema.items() if t.is_numeric()},
        invalid_markers=tuple(c for c in schema if c.endswith("_pct")),
        parse_as=parse_as,
        **kw,
    )


TABLES: dict[str, CsvTable] = {
    "machine_meta": _spec("machine_meta", ("machine_id", "time_s")),
    "machine_usage": _spec(
        "machine_usage", ("machine_id", "time_s"), order_keys=("machine_id",), order_time="time_s"
    ),
    "container_meta": _spec("container_meta", ("container_id", "machine_id", "time_s")),
    # the head of the real file has thousands of rows with an empty container_id: "empty container_id"
    "container_usage": _spec(
        "container_usage",
        ("container_id", "machine_id", "time_s"),
        order_keys=("container_id",),
        order_time="time_s",
    ),
    "batch_task": _spec("batch_task", ("task_name", "job_name", "start_time_s", "end_time_s")),
    "batch_instance": _spec("batch_instance", ("instance_name", "task_name", "job_name")),
}


def _member_matcher(table: str):
    return lambda name: Path(name).name == f"{table}.csv"


# ---------------------------------------------------------------- canonical mapping

STATES = {"stopped": "finished", "started": "running", "allocated": "running"}
"""container_meta status -> canonical final state (anything else: unknown)."""
DEFAULT_CPU_NUM = 96
"""Cores of a machine missing from machine_meta (every known machine has 96)."""


def container_meta(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Per container: last known machine, requests, status and meta time span, plus its machine's cpu_num.

    Columns: container_id, meta_machine_id, cpu_request_centicores, mem_size_pct, status, meta_first_s,
    meta_last_s, cpu_num (null when the machine is not in machine_meta), has_meta (True).
    """
    meta = raw.get("container_meta")
    if meta is None:
        return empty_frame({"container_id": pl.String, "meta_machine_id": pl.String,
                            "cpu_request_centicores": pl.Float64, "mem_size_pct": pl.Float64,
                            "status": pl.String, "meta_first_s": pl.Int64, "meta_last_s": pl.Int64,
                            "cpu_num": pl.Int32, "has_meta": pl.Boolean}).lazy()  # fmt: skip
    per_container = (
        meta.filter(pl.col("container_id").is_not_null() & (pl.col("container_id") != ""))
        .sort("container_id", "time_s", maintain_order=True)
        .group_by("container_id")
        .agg(
            last_value("machine_id").alias("meta_machine_id"),
            last_value("cpu_request_centicores"),
            last_value("mem_size_pct"),
            last_value("status"),
            pl.col("time_s").min().alias("meta_first_s"),
            pl.col("time_s").max().alias("meta_last_s"),
            pl.lit(True).alias("has_meta"),
        )
    )
    machines = raw.get("machine_meta")
    if machines is None:
        return per_container.with_columns(pl.lit(None, pl.Int32).alias("cpu_num"))
    cpu_num = (
        machines.sort("machine_id", "time_s", maintain_order=True)
        .group_by("machine_id")
        .agg(last_value("cpu_num").cast(pl.Int32))
        .rename({"machine_id": "meta_machine_id"})
    )
    return per_container.join(cpu_num, on="meta_machine_id", how="left")


def usage_rows(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """container_usage with a non-empty container_id (empty-id rows belong to no workload)."""
    return raw["container_usage"].filter(
        pl.col("container_id").is_not_null() & (pl.col("container_id") != "")
    )


def build_workloads(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Containers of container_meta and container_usage -> WORKLOADS columns (rules in the module docstring)."""
    meta = container_meta(raw)
    if "container_usage" in raw:
        usage = (
            usage_rows(raw)
            .group_by("container_id")
            .agg(
                pl.col("time_s").min().cast(pl.Float64).alias("start_time_s"),
                pl.col("time_s").max().cast(pl.Float64).alias("end_time_s"),
                pl.len().cast(pl.Int64).alias("n_usage_records"),
                pl.col("machine_id").sort_by("time_s").last().alias("usage_machine_id"),
            )
        )
    else:
        usage = empty_frame({"container_id": pl.String, "start_time_s": pl.Float64, "end_time_s": pl.Float64,
                             "n_usage_records": pl.Int64, "usage_machine_id": pl.String}).lazy()  # fmt: skip
    cpu_num = pl.col("cpu_num").fill_null(DEFAULT_CPU_NUM)
    has_meta = pl.col("has_meta").fill_null(False)
    return usage.join(meta, on="container_id", how="full", coalesce=True).with_columns(
        pl.lit(NAME).alias("source"),
        pl.col("container_id").alias("workload_id"),
        pl.coalesce("meta_machine_id", "usage_machine_id").alias("machine_id"),
        pl.col("n_usage_records").fill_null(0),
        (pl.col("cpu_request_centicores") / 100 / cpu_num).alias("cpu_request_frac"),
        (pl.col("mem_size_pct") / 100).alias("mem_request_frac"),
        pl.lit(None, pl.Int32).alias("priority"),
        pl.lit(None, pl.Int32).alias("scheduling_class"),
        pl.col("status")
        .replace_strict(STATES, default="unknown", return_dtype=pl.String)
        .alias("final_state"),
        ((pl.col("n_usage_records").fill_null(0) > 0) & ~has_meta).alias("is_partial"),
    )


def _scale(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Per container with a request: factors from util percent to fractions of a machine."""
    meta = container_meta(raw).filter(
        pl.col("cpu_request_centicores").is_not_null() & pl.col("mem_size_pct").is_not_null()
    )
    return meta.select(
        pl.col("container_id").alias("workload_id"),
        (pl.col("cpu_request_centicores") / 100 / pl.col("cpu_num").fill_null(DEFAULT_CPU_NUM)).alias(
            "cpu_scale"
        ),
        (pl.col("mem_size_pct") / 100).alias("mem_scale"),
        pl.col("cpu_num").is_null().alias("is_default_cpu_num"),
    )


def build_bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """container_usage -> (equal-weight mean per container and 5-minute bin, USAGE_COUNTS of the rows read)."""
    no_id = pl.col("workload_id").is_null() | (pl.col("workload_id") == "")
    bad = pl.when(no_id).then(pl.lit("no_workload_id")).otherwise(bad_reason(pl.col("cpu"), pl.col("mem")))
    rows = raw["container_usage"].select(
        pl.col("container_id").alias("workload_id"), "time_s",
        pl.col("cpu_util_pct").alias("cpu"), pl.col("mem_util_pct").alias("mem"),
    ).with_columns(bad.alias("bad_reason"))  # fmt: skip
    pct_bins = (
        rows.filter(pl.col("bad_reason").is_null())
        .select(
            "workload_id",
            (pl.col("time_s") // BIN_SECONDS * BIN_SECONDS).alias("bin_start_s"),
            pl.col("cpu").alias("cpu_frac"),
            pl.col("mem").alias("mem_frac"),
        )
        .pipe(mean_per_bin, NAME)
    )
    bins = pct_bins.join(_scale(raw), on="workload_id", how="left").with_columns(
        (pl.col("cpu_frac") / 100 * pl.col("cpu_scale").fill_null(1.0)),
        (pl.col("mem_frac") / 100 * pl.col("mem_scale").fill_null(1.0)),
    )
    return bins, count_reasons(rows, NAME)


def count_workloads(raw: dict[str, pl.LazyFrame], ids: pl.LazyFrame) -> pl.LazyFrame:
    """USAGE_COUNTS of the workloads `ids` (one column workload_id, unique): without meta, default cpu_num."""
    per_workload = ids.join(_scale(raw), on="workload_id", how="left")
    wide = per_workload.select(
        pl.col("cpu_scale").is_null().sum().alias("workloads_without_meta"),
        pl.col("is_default_cpu_num").fill_null(False).sum().alias("workloads_default_cpu_num"),
    )
    return counts_frame(wide, NAME)


LONG_RUNNING = LongRunningRule("observed_bins", 2000, max_gap_bins=12)
"""Default long-running rule: TVW-RL's 2000 records, counted as 5-minute bins with a sample (module docstring).
A kept window bridges gaps of up to 12 missing bins (one hour): container_usage is sampled irregularly (about
35 % of the head's 5-minute bins have a record; gap-free runs are 5-10 bins), so a gap-free window could not be as
long as the records; longer gaps end the window."""

USAGE_CHUNK_ROWS = 10_000_000
"""container_usage rows per chunk of the usage build (about 0.5 GB of CSV). Measured with
benchmarks/bench_alibaba_usage.py: 2.0 GiB peak RSS for the whole build, whatever the table's size."""

USAGE_MAPPING = UsageMapping(
    build_bins,
    "container_usage",
    {"container_usage": (pl.col("time_s"), 1)},
    small_tables=("container_meta", "machine_meta"),
    workload_counts=count_workloads,
    chunking=WorkloadChunks({"container_usage": pl.col("container_id")}, USAGE_CHUNK_ROWS),
)
"""container_usage binned by sample time. The official file is sorted by container_id as a string (the ingest
keeps file order in the raw Parquet), so the usage build reads it in ranges of container ids: a time chunk would
scan the whole table, a container range reads only its own row groups."""


class Alibaba2018Source:
    """The Alibaba 2018 trace under `<root>/alibaba-2018/`: `<table>.tar.gz` or `<table>[.anything].csv[.gz]`."""

    name = NAME
    folder = FOLDER
    tables = tuple(SCHEMAS)
    schemas = SCHEMAS
    column_docs = COLUMN_DOCS
    long_running = LONG_RUNNING
    usage = USAGE_MAPPING

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Files of `table`: the official tarball if present, else every matching CSV (sorted by name)."""
        folder = Path(root) / FOLDER
        tarball = list_shards(self, table, folder, lambda n: n == f"{table}.tar.gz")
        if tarball:
            return tarball
        pattern = re.compile(rf"{re.escape(table)}(\.[A-Za-z0-9_-]+)?\.csv(\.gz)?")
        return list_shards(self, table, folder, lambda n: pattern.fullmatch(n) is not None)

    def iter_batches(
        self, table: str, path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedBatch]:
        """Parsed batches of one file (streamed; a tarball is read member by member, never unpacked)."""
        if table not in self.tables:
            raise IngestError(path, f"unknown {NAME} table {table!r}")
        yield from iter_csv_batches(TABLES[table], Path(path), batch_bytes, member=_member_matcher(table))

    def workloads(self, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
        """The WORKLOADS columns of every container (rules in the module docstring)."""
        return build_workloads(raw)
