"""Typed schemas of the raw tables, one per (source, table), in the trace's own column order.

Names carry units: `_us` microseconds of trace time (Google: since 600 s before the trace start,
special values 0 and 2**63-1 kept as they are), `_s` seconds, `_frac` Google's normalised
fraction of the largest machine, `_pct` Alibaba's 0-100 percentages, `_centicores` Alibaba's
"100 = 1 core". Documented invalid markers (Alibaba -1 / 101) become null.
"""

from __future__ import annotations

import polars as pl

I64, I32, I8, F64, STR, BOOL = pl.Int64, pl.Int32, pl.Int8, pl.Float64, pl.String, pl.Boolean

GOOGLE2011 = {
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

ALIBABA2018 = {
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

GOOGLE2011_DERIVED = {
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

RAW_SCHEMAS: dict[str, dict[str, dict[str, pl.DataType]]] = {
    "google2011": GOOGLE2011,
    "alibaba2018": ALIBABA2018,
    "google2011_derived": GOOGLE2011_DERIVED,
}
"""source name -> table name -> polars schema."""
