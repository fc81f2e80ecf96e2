-- materialized: view
-- One row per audit, its lineage end to end: the parsed config (configs) -> the profiled, sketch and
-- patched runs (runs) -> the sketch rows of the sketch run (sketches) -> the findings mined from them
-- (patterns) -> the rules checked (kb_matches) -> the benchmark arms (benchmarks) -> the report (audits).
WITH cfg AS (
    SELECT audit_id, any_value(workload) AS workload, count(*) AS config_fields,
           count(*) FILTER (WHERE status <> 'unset') AS config_fields_known
    FROM configs GROUP BY audit_id
), run AS (
    SELECT audit_id,
           max(CASE WHEN label = 'profile' THEN run_id END) AS profile_run_id,
           max(CASE WHEN label = 'sketch' THEN run_id END)  AS sketch_run_id,
           max(CASE WHEN label = 'patched' THEN run_id END) AS patched_run_id,
           max(CASE WHEN label = 'profile' THEN provenance END) AS provenance
    FROM runs WHERE audit_id IS NOT NULL GROUP BY audit_id
), sk AS (
    SELECT run_id, count(*) AS sketch_rows, count(DISTINCT site) AS sketch_sites FROM sketches GROUP BY run_id
), pat AS (
    SELECT run_id, count(*) AS patterns, string_agg(DISTINCT finding, ',' ORDER BY finding) AS findings
    FROM patterns GROUP BY run_id
), kb AS (
    SELECT audit_id, count(*) AS rules_checked, count(*) FILTER (WHERE fired) AS rules_fired,
           string_agg(CASE WHEN fired THEN rule_id END, ',' ORDER BY rule_id) AS fired_rules
    FROM kb_matches GROUP BY audit_id
), bm AS (
    SELECT audit_id, max(CASE WHEN label = 'baseline' THEN median_per_s END) AS baseline_median_per_s,
           max(CASE WHEN label = 'patched' THEN median_per_s END) AS patched_median_per_s,
           any_value(unit) AS unit
    FROM benchmarks GROUP BY audit_id
)
SELECT
    cfg.audit_id, cfg.workload, run.provenance, cfg.config_fields, cfg.config_fields_known,
    run.profile_run_id, run.sketch_run_id, sk.sketch_rows, sk.sketch_sites, pat.patterns, pat.findings,
    kb.rules_checked, kb.rules_fired, kb.fired_rules,
    bm.baseline_median_per_s, bm.patched_median_per_s, bm.unit, run.patched_run_id,
    a.measured_speedup, a.rules AS applied_rules, a.report_path
FROM cfg
LEFT JOIN run USING (audit_id)
LEFT JOIN sk ON sk.run_id = run.sketch_run_id
LEFT JOIN pat ON pat.run_id = run.sketch_run_id
LEFT JOIN kb USING (audit_id)
LEFT JOIN bm USING (audit_id)
LEFT JOIN audits AS a USING (audit_id)
