-- materialized: view
-- How often each KB rule fired across audits, and its mean retrieval score.
SELECT
    rule_id,
    count(DISTINCT audit_id) AS audits_checked,
    count(DISTINCT CASE WHEN fired THEN audit_id END) AS audits_fired,
    count(DISTINCT CASE WHEN fired THEN audit_id END) / count(DISTINCT audit_id) AS firing_rate,
    count(DISTINCT CASE WHEN fired THEN workload END) AS workloads_fired,
    avg(retrieval_score) AS mean_retrieval_score,
    avg(detect_score) AS mean_detect_score
FROM kb_matches
GROUP BY rule_id
ORDER BY audits_fired DESC, rule_id
