-- materialized: view
-- Per run, site and role: density (nnz/numel), absmax, mean and RMS averaged over steps.
SELECT
    run_id, workload, model, site, role,
    any_value(M) AS M, any_value(K) AS K, any_value(N) AS N, any_value(numel) AS numel,
    count(*) AS steps,
    avg(nnz / numel) AS density,
    max(greatest(abs(min_value), abs(max_value))) AS absmax,
    avg(mean_value) AS mean,
    avg(sqrt(sumsq / numel)) AS rms
FROM stg_sketch_scalars
GROUP BY run_id, workload, model, site, role
