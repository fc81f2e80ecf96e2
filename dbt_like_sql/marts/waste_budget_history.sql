-- materialized: view
-- Per run: the waste budget as columns (ms per step), in time order, for trend charts.
SELECT
    w.run_id, w.workload, w.label, m.created_at, m.step_time_s, m.throughput_per_s, m.unit,
    1000 * sum(CASE WHEN w.bucket = 'useful' THEN w.time_per_step_s END)         AS useful_ms,
    1000 * sum(CASE WHEN w.bucket = 'data_wait' THEN w.time_per_step_s END)      AS data_wait_ms,
    1000 * sum(CASE WHEN w.bucket = 'host_gap' THEN w.time_per_step_s END)       AS host_gap_ms,
    1000 * sum(CASE WHEN w.bucket = 'comm_excess' THEN w.time_per_step_s END)    AS comm_excess_ms,
    1000 * sum(CASE WHEN w.bucket = 'precision_path' THEN w.time_per_step_s END) AS precision_path_ms,
    1000 * sum(CASE WHEN w.bucket = 'kernel_shape' THEN w.time_per_step_s END)   AS kernel_shape_ms,
    max(CASE WHEN w.bucket = 'data_wait' THEN w.share END)               AS data_wait_share
FROM waste_budget AS w
JOIN stg_run_metrics AS m USING (run_id)
GROUP BY w.run_id, w.workload, w.label, m.created_at, m.step_time_s, m.throughput_per_s, m.unit
ORDER BY m.created_at
