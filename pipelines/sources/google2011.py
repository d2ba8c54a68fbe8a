"""Google clusterdata-2011-2: headerless gzip CSV shards `<table>/part-NNNNN-of-00500.csv.gz`.

Every numeric column has a valid range (`valid_range`); a value outside it, NaN or infinite, sends its line
to the quarantine with the reason.

Time convention (kept as in the trace, not converted): `*_time_us` are int64 microseconds since
600 s before the start of the trace window (an event 20 s into the window has 620,000,000);
0 means "before the window" and 2**63 - 1 means "after the window". Usage windows are nominally
300 s. Resource columns (`_frac`) are normalised to the largest machine (= 1.0).

Canonical mapping (`workloads`, `usage`):
  * Workload = task, `workload_id = "<job_id>/<task_index>"`. The set of workloads is the union of the tasks
    seen in task_usage and in task_events (a task with events and no usage is kept; the long-running filter
    reports it as `no_usage`).
  * Times: trace time in seconds, i.e. seconds since 600 s before the trace start (µs / 1e6, no shift).
    `start_time_s` = earliest usage window start, `end_time_s` = latest usage window end,
    `n_usage_records` = raw task_usage rows (valid or not).
  * Requests, priority, scheduling class: the last non-null value over the task's events in time order. A
    synthesized row (missing_info set, empty requests) therefore takes its requests from another event of
    the same task, as the trace documentation advises.
  * `final_state`: the worst outcome in the task's history. If the task was ever evicted, failed, killed or
    lost (2 EVICT, 3 FAIL, 5 KILL, 6 LOST), the last such event decides, even when it was rescheduled and later
    FINISHed: TVW-RL discards workloads that were evicted, killed or failed, and such a task's series also
    spans a restart (often on another machine). Otherwise FINISH (4) gives `finished`, and a task with events
    but no terminal event is `running`. No task_events table, or a task absent from it: `unknown`.
  * `machine_id`: the machine of the last usage record; without usage, the last machine in task_events.
  * `is_partial` (only for tasks with usage): let [c0, c1] be what task_usage covers (earliest window start,
    latest window end, over the whole table). A task is partial when
      (a) its first record starts at or after c0 + 300 s (i.e. it was not already running in the first
          window) and the data holds no SUBMIT (0) or SCHEDULE (1) event for it — its start is not recorded;
          a task scheduled at time 0 and running from the first window is NOT partial, or
      (b) its last record ends at or before c1 - 300 s (it stopped reporting at least one window before the
          data ends) and the data holds no terminal event for it — its records were cut.
    Without task_events nothing is explained, so every late starter or early stopper is partial.
  * Usage: t = window start (µs / 1e6). `cpu_frac = cpu_rate_frac`, `mem_frac = canonical_mem_frac` (both
    already rescaled so the largest machine = 1.0, i.e. fractions of the largest machine). Several windows in one
    bin -> time-weighted mean, weight = window length (end - start); when every window of the bin has length 0,
    the plain mean. `n_samples` = windows in the bin. A window ending before it starts: `rows_dropped_bad_window`.
  * Long-running: at least 6000 contiguous 5-minute bins (TVW-RL).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from pipelines.schemas import BIN_SECONDS, WORKLOADS, empty_frame
from pipelines.sources.base import (
    DEFAULT_BATCH_BYTES,
    CsvTable,
    ParsedBatch,
    check_table,
    iter_csv_batches,
    list_shards,
)
from pipelines.sources.mapping import (
    LongRunningRule,
    TimeChunks,
    UsageMapping,
    bad_reason,
    count_reasons,
    last_value,
)

I64, I32, I8, F64, STR, BOOL = pl.Int64, pl.Int32, pl.Int8, pl.Float64, pl.String, pl.Boolean

NAME = "google2011"
FOLDER = "google-2011"

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "job_events": {
        "time_us": I64,
        "missing_info": I8,
        "job_id": I64,
        "event_type": I8,
        "user": STR,
        "scheduling_class": I8,
        "job_name": STR,
        "logical_job_name": STR,
    },
    "task_events": {
        "time_us": I64,
        "missing_info": I8,
        "job_id": I64,
        "task_index": I32,
        "machine_id": I64,
        "event_type": I8,
        "user": STR,
        "scheduling_class": I8,
        "priority": I8,
        "cpu_request_frac": F64,
        "mem_request_frac": F64,
        "disk_request_frac": F64,
        "is_different_machines": BOOL,
    },
    "task_usage": {
        "start_time_us": I64,
        "end_time_us": I64,
        "job_id": I64,
        "task_index": I32,
        "machine_id": I64,
        "cpu_rate_frac": F64,
        "canonical_mem_frac": F64,
        "assigned_mem_frac": F64,
        "unmapped_page_cache_frac": F64,
        "total_page_cache_frac": F64,
        "max_mem_frac": F64,
        "disk_io_time_frac": F64,
        "local_disk_frac": F64,
        "max_cpu_rate_frac": F64,
        "max_disk_io_time_frac": F64,
        "cpi": F64,
        "mai": F64,
        "sample_portion": F64,
        "is_aggregated": BOOL,
        "sampled_cpu_rate_frac": F64,
    },
    "machine_events": {
        "time_us": I64,
        "machine_id": I64,
        "event_type": I8,
        "platform_id": STR,
        "cpu_capacity_frac": F64,
        "mem_capacity_frac": F64,
    },
    "machine_attributes": {
        "time_us": I64,
        "machine_id": I64,
        "attribute_name": STR,
        "attribute_value": STR,
        "is_deleted": BOOL,
    },
    "task_constraints": {
        "time_us": I64,
        "job_id": I64,
        "task_index": I32,
        "comparison_operator": I8,
        "attribute_name": STR,
        "attribute_value": STR,
    },
}
"""Raw tables, in the trace's own column order; `_frac` = Google's normalised fraction of the largest machine."""

_TIME_US = (
    "microseconds of trace time, counted from 600 s before the trace start (the trace opens at 600 s, 19:00 EDT "
    "on 1 May 2011); 0 = before the trace window, 2^63-1 = after it"
)
_MISSING_INFO = (
    "set only on a record the trace synthesised or left incomplete (0 snapshot but no transition, 1 no snapshot "
    "or transition, 2 exists but no creation); null on an ordinary record"
)
_EVENT_TYPE = (
    "what happened: 0 submit, 1 schedule, 2 evict, 3 fail, 4 finish, 5 kill, 6 lost, 7 update while pending, "
    "8 update while running"
)
_LARGEST = "rescaled so that the largest machine of the cell is 1.0"
_JOB = "Google job id (a 64-bit integer, unique in the trace)"
_TASK = "0-based index of the task within its job; (job_id, task_index) names one task"
_SCHEDULING_CLASS = "latency sensitivity, 0 (non-production) to 3 (most latency-sensitive); null when absent"

COLUMN_DOCS: dict[str, dict[str, str]] = {
    "job_events": {
        "time_us": f"event time, {_TIME_US}",
        "missing_info": _MISSING_INFO,
        "job_id": _JOB,
        "event_type": _EVENT_TYPE,
        "user": "user who submitted the job, hashed (base64); null when absent",
        "scheduling_class": _SCHEDULING_CLASS,
        "job_name": "name of the job, hashed; null when absent",
        "logical_job_name": "logical name of the job, hashed; null when absent",
    },
    "task_events": {
        "time_us": f"event time, {_TIME_US}",
        "missing_info": _MISSING_INFO,
        "job_id": _JOB,
        "task_index": _TASK,
        "machine_id": "machine the task was placed on; null while it is not placed",
        "event_type": _EVENT_TYPE + "; a task evicted or failed can be submitted and scheduled again",
        "user": "user who submitted the job, hashed (base64); null when absent",
        "scheduling_class": _SCHEDULING_CLASS,
        "priority": "priority 0..11, larger is more important (0-1 free, 9-11 production)",
        "cpu_request_frac": f"CPU the task requests, in cores {_LARGEST}; null when absent (synthesised rows)",
        "mem_request_frac": f"memory the task requests, {_LARGEST}; null when absent",
        "disk_request_frac": f"local disk space the task requests, {_LARGEST}; null when absent",
        "is_different_machines": "the task must run on a machine apart from every other task of its job",
    },
    "task_usage": {
        "start_time_us": f"start of the measurement window (nominally 300 s, shorter around starts and stops), "
        f"{_TIME_US}",
        "end_time_us": f"end of the measurement window, {_TIME_US}; a task's windows do not overlap",
        "job_id": _JOB,
        "task_index": _TASK,
        "machine_id": "machine the task ran on during the window",
        "cpu_rate_frac": f"mean CPU usage over the window, core-seconds per second {_LARGEST}",
        "canonical_mem_frac": f"mean canonical memory usage over the window, bytes {_LARGEST}",
        "assigned_mem_frac": f"memory assigned to the task's container, bytes {_LARGEST}",
        "unmapped_page_cache_frac": f"page cache not mapped by the task, bytes {_LARGEST}",
        "total_page_cache_frac": f"total page cache of the task, bytes {_LARGEST}",
        "max_mem_frac": f"largest memory usage seen in the window, bytes {_LARGEST}",
        "disk_io_time_frac": "mean disk I/O time over the window (recorded in about the first 14 days only)",
        "local_disk_frac": f"mean local disk space used, {_LARGEST}",
        "max_cpu_rate_frac": f"largest CPU rate seen in the window, {_LARGEST}",
        "max_disk_io_time_frac": "largest disk I/O time seen in the window",
        "cpi": "cycles per instruction (some values on windows of almost no CPU are implausible)",
        "mai": "memory accesses per instruction (some values are implausible, as for cpi)",
        "sample_portion": "portion of the window covered by the measurement",
        "is_aggregated": "aggregation type: the maximum columns were summed over the task's sub-containers",
        "sampled_cpu_rate_frac": f"mean CPU usage during one random 1-second sample inside the window, {_LARGEST} "
        "(the column 2011-2 added)",
    },
    "machine_events": {
        "time_us": f"event time, {_TIME_US}",
        "machine_id": "machine id (a 64-bit integer)",
        "event_type": "0 add (the machine joins the cell), 1 remove (it leaves), 2 update (its capacity changes)",
        "platform_id": "microarchitecture and chipset of the machine, hashed",
        "cpu_capacity_frac": f"CPU capacity of the machine, {_LARGEST} (0.25, 0.5 or 1.0); null when absent",
        "mem_capacity_frac": f"memory capacity of the machine, {_LARGEST}; null when absent",
    },
    "machine_attributes": {
        "time_us": f"time the attribute was set or deleted, {_TIME_US}",
        "machine_id": "machine the attribute belongs to",
        "attribute_name": "name of the attribute, hashed",
        "attribute_value": "value of the attribute: a hashed string or an integer, as text",
        "is_deleted": "the attribute was deleted at this time",
    },
    "task_constraints": {
        "time_us": f"time the placement constraint was set, {_TIME_US}",
        "job_id": _JOB,
        "task_index": _TASK,
        "comparison_operator": "how the machine attribute is compared: 0 equal, 1 not equal, 2 less than, "
        "3 greater than",
        "attribute_name": "machine attribute the constraint is on, hashed",
        "attribute_value": "value the attribute is compared against: a hashed string or an integer, as text",
    },
}
"""Raw table -> column -> what it holds (the trace's schema, `trace-schemas.md` section 1, in words)."""

TIME_BEFORE_WINDOW_US = 0
"""Special time value: the event happened before the trace window."""
TIME_AFTER_WINDOW_US = 2**63 - 1
"""Special time value: the event happened after the trace window."""
TRACE_OFFSET_US = 600_000_000
"""Trace time of the start of the window (600 s)."""


def _bools_as_int8(schema: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    # booleans are written 0/1 in the trace; polars' CSV reader wants true/false
    return {c: pl.Int8 for c, t in schema.items() if t == pl.Boolean}


UNBOUNDED_FRAC = ("disk_io_time_frac", "max_disk_io_time_frac", "max_cpu_rate_frac", "sampled_cpu_rate_frac")
"""`_frac` columns that are not a share of one machine's capacity held over the window: disk I/O time per second
(several disks can push it above 1), and the CPU peaks and 1-second samples (short measurements, not a mean;
only the window mean `cpu_rate_frac` enters the usage table)."""
VALID_RANGES = {
    "event_type": (0, 8),  # SUBMIT .. UPDATE_RUNNING
    "missing_info": (0, 2),  # SNAPSHOT_BUT_NO_TRANSITION .. EXISTS_BUT_NO_CREATION
    "scheduling_class": (0, 3),
    "priority": (0, 11),
    "sample_portion": (0, 1),
}
"""Columns with a documented range other than non-negative (ClusterData2011_2.md, schema.csv, the format doc)."""


def valid_range(column: str) -> tuple[float | None, float | None]:
    """The valid range of a numeric raw column: `VALID_RANGES`; a normalised size or rate (`_frac`: a share of
    the largest machine, which holds at most the whole machine) on [0, 1] except `UNBOUNDED_FRAC`; anything else
    (times in µs with their special values 0 and 2**63 - 1, ids, indexes, cpi, mai) non-negative. Every float is
    also finite."""
    if column in VALID_RANGES:
        return VALID_RANGES[column]
    if column.endswith("_frac") and column not in UNBOUNDED_FRAC:
        return 0, 1
    return 0, None


def _spec(table: str, mandatory: tuple[str, ...], **kw) -> CsvTable:
    schema = SCHEMAS[table]
    parse_as = _bools_as_int8(schema)
    return CsvTable(
        source=NAME,
        table=table,
        schema=schema,
        mandatory=mandatory,
        ranges={c: valid_range(c) for c, t in schema.items() if parse_as.get(c, t).is_numeric()},
        parse_as=parse_as,
        **kw,
    )


# mandatory fields: the bucket's schema.csv ("mandatory" = YES)
TABLES: dict[str, CsvTable] = {
    "job_events": _spec("job_events", ("time_us", "job_id", "event_type")),
    "task_events": _spec("task_events", ("time_us", "job_id", "task_index", "event_type", "priority")),
    "task_usage": _spec(
        "task_usage",
        ("start_time_us", "end_time_us", "job_id", "task_index", "machine_id"),
        order_keys=("job_id", "task_index"),
        order_time="start_time_us",
    ),
    "machine_events": _spec("machine_events", ("time_us", "machine_id", "event_type")),
    "machine_attributes": _spec(
        "machine_attributes", ("time_us", "machine_id", "attribute_name", "is_deleted")
    ),
    "task_constraints": _spec(
        "task_constraints", ("time_us", "job_id", "task_index", "comparison_operator", "attribute_name")
    ),
}


# ---------------------------------------------------------------- canonical mapping

US_PER_S = 1_000_000
TERMINAL_STATES = {2: "evicted", 3: "failed", 4: "finished", 5: "killed", 6: "lost"}
"""Terminal event codes -> canonical final state."""
BAD_EVENTS = [2, 3, 5, 6]
"""Terminal events that disqualify a task for good, whatever happened after (see `final_state`)."""
START_EVENTS = (0, 1)
"""SUBMIT and SCHEDULE: events that record a task's start."""


def workload_id(job: str = "job_id", task: str = "task_index") -> pl.Expr:
    """Workload id `"<job_id>/<task_index>"`."""
    return pl.format("{}/{}", pl.col(job), pl.col(task)).alias("workload_id")


def _usage_summary(usage: pl.LazyFrame) -> pl.LazyFrame:
    return usage.group_by("job_id", "task_index").agg(
        (pl.col("start_time_us").min() / US_PER_S).alias("start_time_s"),
        (pl.col("end_time_us").max() / US_PER_S).alias("end_time_s"),
        pl.len().cast(pl.Int64).alias("n_usage_records"),
        pl.col("machine_id").sort_by("end_time_us").last().alias("usage_machine_id"),
    )


def _event_summary(events: pl.LazyFrame) -> pl.LazyFrame:
    terminal = pl.col("event_type").is_in(list(TERMINAL_STATES))
    return (
        events.sort("job_id", "task_index", "time_us", maintain_order=True)
        .group_by("job_id", "task_index")
        .agg(
            last_value("cpu_request_frac"),
            last_value("mem_request_frac"),
            last_value("priority").cast(pl.Int32),
            last_value("scheduling_class").cast(pl.Int32),
            last_value("machine_id").alias("event_machine_id"),
            pl.coalesce(
                pl.col("event_type").filter(pl.col("event_type").is_in(BAD_EVENTS)).last(),
                pl.col("event_type").filter(terminal).last(),
            ).alias("last_terminal"),
            pl.col("event_type").is_in(START_EVENTS).any().alias("has_start_event"),
            terminal.any().alias("has_terminal_event"),
            pl.lit(True).alias("has_events"),
        )
    )


def _is_partial(c0: pl.Expr, c1: pl.Expr) -> pl.Expr:
    late_start = (pl.col("start_time_s") >= c0 + BIN_SECONDS) & ~pl.col("has_start_event")
    early_end = (pl.col("end_time_s") <= c1 - BIN_SECONDS) & ~pl.col("has_terminal_event")
    return (pl.col("n_usage_records") > 0) & (late_start | early_end)


def _empty(table: str, cols: tuple[str, ...]) -> pl.LazyFrame:
    return empty_frame({c: SCHEMAS[table][c] for c in cols}).lazy()


def build_workloads(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Tasks of task_usage and task_events -> WORKLOADS columns (rules in the module docstring)."""
    usage = raw.get("task_usage")
    events = raw.get("task_events")
    if usage is None and events is None:
        return empty_frame(WORKLOADS).lazy()
    if usage is None:
        usage = _empty("task_usage", ("start_time_us", "end_time_us", "job_id", "task_index", "machine_id"))
    if events is None:
        events = _empty("task_events", ("time_us", "job_id", "task_index", "machine_id", "event_type", "priority",
                                        "scheduling_class", "cpu_request_frac", "mem_request_frac"))  # fmt: skip
    coverage = usage.select(
        (pl.col("start_time_us").min() / US_PER_S).alias("c0"),
        (pl.col("end_time_us").max() / US_PER_S).alias("c1"),
    )
    state = pl.col("last_terminal").replace_strict(TERMINAL_STATES, default=None, return_dtype=pl.String)
    return (
        _usage_summary(usage)
        .join(_event_summary(events), on=["job_id", "task_index"], how="full", coalesce=True)
        .join(coverage, how="cross")
        .with_columns(
            workload_id(),
            pl.lit(NAME).alias("source"),
            pl.coalesce("usage_machine_id", "event_machine_id").cast(pl.String).alias("machine_id"),
            pl.col("n_usage_records").fill_null(0),
            pl.col("has_start_event").fill_null(False),
            pl.col("has_terminal_event").fill_null(False),
            pl.when(pl.col("has_events"))
            .then(state.fill_null("running"))
            .otherwise(pl.lit("unknown"))
            .alias("final_state"),
        )
        .with_columns(_is_partial(pl.col("c0"), pl.col("c1")).alias("is_partial"))
    )


def build_bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """task_usage -> (time-weighted mean per task and 5-minute bin, USAGE_COUNTS of the rows read)."""
    rows = raw["task_usage"].select(
        "job_id", "task_index", "start_time_us", "end_time_us",
        pl.col("cpu_rate_frac").alias("cpu"), pl.col("canonical_mem_frac").alias("mem"),
    )  # fmt: skip
    bad = bad_reason(pl.col("cpu"), pl.col("mem"))
    bad = bad.when(pl.col("end_time_us") < pl.col("start_time_us")).then(pl.lit("bad_window"))
    rows = rows.with_columns(bad.alias("bad_reason"))
    weight = (pl.col("end_time_us") - pl.col("start_time_us")).cast(pl.Float64)

    def weighted(c: str) -> pl.Expr:
        return pl.when(pl.col("w") > 0).then(pl.col(f"{c}_w") / pl.col("w")).otherwise(pl.col(f"{c}_mean"))

    bins = (
        rows.filter(pl.col("bad_reason").is_null())
        .with_columns(
            (pl.col("start_time_us") // (BIN_SECONDS * US_PER_S) * BIN_SECONDS).alias("bin_start_s")
        )
        .group_by("job_id", "task_index", "bin_start_s")
        .agg(
            (weight * pl.col("cpu")).sum().alias("cpu_w"),
            (weight * pl.col("mem")).sum().alias("mem_w"),
            weight.sum().alias("w"),
            pl.col("cpu").mean().alias("cpu_mean"),
            pl.col("mem").mean().alias("mem_mean"),
            pl.len().cast(pl.Int32).alias("n_samples"),
        )
        .with_columns(
            pl.lit(NAME).alias("source"),
            workload_id(),
            weighted("cpu").alias("cpu_frac"),
            weighted("mem").alias("mem_frac"),
        )
    )
    return bins, count_reasons(rows, NAME)


USAGE_MAPPING = UsageMapping(
    build_bins,
    "task_usage",
    {"task_usage": (pl.col("start_time_us"), US_PER_S)},
    chunking=TimeChunks(6 * 3600),
)
"""task_usage binned by window start; chunks filter on start_time_us (the shards are in time order)."""


class Google2011Source:
    """The Google 2011 trace in the bucket's layout under `<root>/google-2011/`."""

    name = NAME
    folder = FOLDER
    tables = tuple(SCHEMAS)
    schemas = SCHEMAS
    column_docs = COLUMN_DOCS
    long_running = LongRunningRule("contiguous_bins", 6000)
    usage = USAGE_MAPPING

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Shards of `table`: file name (e.g. `part-00000-of-00500.csv.gz`) -> path, sorted."""
        return list_shards(
            self, table, Path(root) / FOLDER / table, lambda n: n.endswith((".csv.gz", ".csv"))
        )

    def iter_batches(
        self, table: str, path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedBatch]:
        """Parsed batches of one shard (streamed)."""
        check_table(self, table)
        yield from iter_csv_batches(TABLES[table], Path(path), batch_bytes)

    def workloads(self, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
        """The WORKLOADS columns of every task (rules in the module docstring)."""
        return build_workloads(raw)
