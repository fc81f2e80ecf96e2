-- materialized: view
-- Runs with their audit's workload and label, one row per profiled run.
SELECT
    r.run_id, r.audit_id, r.workload, r.label, r.created_at, r.provenance, r.device, r.torch_version,
    r.steps, r.step_time_s, coalesce(r.tokens_per_sec, r.samples_per_sec) AS throughput_per_s,
    CASE WHEN r.tokens_per_sec IS NOT NULL THEN 'tokens' ELSE 'samples' END AS unit,
    r.mfu_pct, r.mem_peak_gb, r.util_pct
FROM runs AS r
WHERE r.ok
