-- materialized: view
-- GEMM shapes (M, K, N) seen across workloads, by how many sites and runs use them:
-- the autotune / kernel-dispatch targets.
SELECT
    M, K, N,
    2 * M * K * N AS flops_per_call,
    count(DISTINCT run_id || '/' || site) AS site_runs,
    count(DISTINCT workload) AS workloads,
    string_agg(DISTINCT workload, ', ') AS workload_list,
    (M % 64 = 0 AND K % 64 = 0 AND N % 64 = 0) AS multiple_of_64
FROM stg_sketch_scalars
WHERE role = 'out'
GROUP BY M, K, N
ORDER BY flops_per_call * site_runs DESC
