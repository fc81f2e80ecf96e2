-- materialized: view
-- Predicted vs measured speedup per applied rule (the calibration table).
WITH applied AS (
    SELECT a.audit_id, a.workload, a.measured_speedup, a.predicted_speedup_low, a.predicted_speedup_high,
           unnest(string_split(a.rules, ',')) AS rule_id
    FROM audits AS a
    WHERE a.rules <> ''
)
SELECT
    rule_id,
    count(*) AS audits,
    avg(measured_speedup) AS mean_measured_speedup,
    avg(predicted_speedup_low) AS mean_predicted_low,
    avg(predicted_speedup_high) AS mean_predicted_high,
    avg(CASE WHEN measured_speedup BETWEEN predicted_speedup_low AND predicted_speedup_high THEN 1 ELSE 0 END)
        AS within_predicted_range,
    avg(measured_speedup / ((predicted_speedup_low + predicted_speedup_high) / 2)) AS measured_over_predicted_mid
FROM applied
GROUP BY rule_id
ORDER BY audits DESC, rule_id
