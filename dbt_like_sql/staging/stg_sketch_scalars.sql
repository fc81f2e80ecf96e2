-- materialized: view
-- One row per (run, step, site, role) with the scalar sketches as columns.
SELECT
    run_id, workload, model, step, backend, dist, site, role, M, K, N, numel,
    max(CASE WHEN stat = 'min' THEN value END)   AS min_value,
    max(CASE WHEN stat = 'max' THEN value END)   AS max_value,
    max(CASE WHEN stat = 'mean' THEN value END)  AS mean_value,
    max(CASE WHEN stat = 'l1' THEN value END)    AS l1,
    max(CASE WHEN stat = 'sumsq' THEN value END) AS sumsq,
    max(CASE WHEN stat = 'nnz' THEN value END)   AS nnz
FROM sketches
WHERE idx = 0
GROUP BY ALL
