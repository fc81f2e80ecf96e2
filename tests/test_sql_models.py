"""SQL models: lineage parsed from the SQL, built as views/tables over real warehouse rows."""
from __future__ import annotations

import json

import dagster as dg
import pytest

from goblin_assets.definitions import defs
from goblin_assets.errors import WarehouseError
from goblin_assets.warehouse.db import connect
from goblin_assets.warehouse.sql_models import build_model, load_models, upstream_tables


def test_upstream_tables_come_from_the_sql():
    sql = "WITH x AS (SELECT * FROM sketches) SELECT * FROM x JOIN runs USING (run_id), kernels"
    assert upstream_tables(sql) == ("kernels", "runs", "sketches")  # the CTE x is not a table


def test_models_are_layered_and_ordered():
    models = load_models()
    names = [m.name for m in models]
    for required in ("site_sketch_summary", "waste_budget_history", "rule_firing_frequency",
                     "speedup_calibration", "hot_gemm_shapes"):
        assert required in names
    pos = {n: i for i, n in enumerate(names)}
    for m in models:
        for up in m.upstream:
            if up in pos:
                assert pos[up] < pos[m.name]      # dependency order
        assert m.materialized in ("view", "table") and m.layer in ("staging", "marts")


def test_asset_lineage_is_derived_from_sql():
    g = defs.resolve_asset_graph()
    parents = lambda k: {p.to_user_string() for p in g.get(dg.AssetKey(k)).parent_keys}  # noqa: E731
    assert parents("stg_sketch_scalars") == {"tensor_sketches", "opscope_sweep", "opscope_seq", "opscope_digits",
                                             "opscope_minilm", "inference_dynamics"}
    assert {"training_config", "tensor_sketches", "mined_patterns", "kb_matches", "benchmark_baseline",
            "audit_report"} <= parents("audit_lineage")
    assert parents("site_sketch_summary") == {"stg_sketch_scalars"}
    assert parents("rule_firing_frequency") == {"kb_matches"}
    assert parents("speedup_calibration") == {"audit_report"}
    assert "waste_budget" in parents("waste_budget_history")


def test_models_build_on_real_rows(goblin_home):
    """Sketch a real tensor pair with the tap, store the rows, build every model."""
    import torch

    from goblin_assets.opscope.taps import MatmulTap
    from goblin_assets.warehouse.db import write
    import pandas as pd
    from goblin_assets.opscope.record import SKETCH_COLUMNS

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with MatmulTap() as tap:
        for step in range(2):
            model(torch.randn(32, 64))
            tap.flush(step)
    df = pd.DataFrame(tap.rows).assign(run_id="r1", workload="w", model="mlp", backend="cpu", dist="workload")
    write({"sketches": df[SKETCH_COLUMNS]})
    with connect() as con:
        counts = {m.name: build_model(con, m) for m in load_models()}
        summary = con.execute("SELECT site, role, density FROM site_sketch_summary ORDER BY site, role").fetchall()
        shapes = con.execute("SELECT M, K, N FROM hot_gemm_shapes ORDER BY K").fetchall()
    assert counts["site_sketch_summary"] == 6 and counts["hot_gemm_shapes"] == 2
    density = {(s, r): d for s, r, d in summary}
    assert density[("linear_0", "rhs")] == 1.0
    assert 0.3 < density[("linear_1", "lhs")] < 0.7     # post-ReLU of random inputs: about half
    assert shapes == [(32, 64, 128), (32, 128, 10)]


def test_bad_sql_names_the_file(tmp_path):
    (tmp_path / "staging").mkdir()
    (tmp_path / "marts").mkdir()
    (tmp_path / "staging" / "broken.sql").write_text("-- materialized: view\nSELECT FROM WHERE\n")
    with pytest.raises(WarehouseError, match="broken.sql"):
        load_models(tmp_path)
    (tmp_path / "staging" / "broken.sql").write_text("SELECT 1\n")
    with pytest.raises(WarehouseError, match="materialized"):
        load_models(tmp_path)


def test_every_table_names_the_assets_that_write_it():
    """An SQL model's upstream assets come from TABLE_PRODUCERS: a table without writers would lose its lineage."""
    from goblin_assets.definitions import defs
    from goblin_assets.defs.sql import TABLE_PRODUCERS
    from goblin_assets.warehouse.tables import TABLES

    assert set(TABLE_PRODUCERS) == set(TABLES)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {a for writers in TABLE_PRODUCERS.values() for a in writers} <= keys


def _audit_tables() -> set[str]:
    """Warehouse tables an audit writes (its stages' assets write them: TABLE_PRODUCERS), as the SQL names them."""
    from goblin_assets.defs.audit import AUDIT_STAGES
    from goblin_assets.defs.sql import STORES, TABLE_PRODUCERS

    stages = {k.to_user_string() for a in AUDIT_STAGES for k in a.keys}
    tidy = {t for t, writers in TABLE_PRODUCERS.items() if stages & set(writers)}
    return tidy | {phys for phys, t in STORES.items() if t in tidy}


def test_every_model_over_audit_rows_is_a_view():
    """A table model is a snapshot taken when its asset ran; one that summarises audits would go stale after the
    next ``goblin audit``: every model reading an audit table, directly or through another model, is a view."""
    models = load_models()
    reads_audits: set[str] = set()
    for m in models:   # dependency order: a model's upstream models are decided first
        if set(m.upstream) & (_audit_tables() | reads_audits):
            reads_audits.add(m.name)
    assert {"waste_budget_history", "speedup_calibration", "rule_firing_frequency", "audit_lineage"} <= reads_audits
    assert [m.name for m in models if m.name in reads_audits and m.materialized != "view"] == []


def test_models_show_each_cli_audit_without_a_rebuild(goblin_home, capsys):
    """Rows written the way ``goblin audit`` writes them are in the models at once: nothing is rebuilt between."""
    from goblin_assets.cli import main
    from goblin_assets.warehouse.db import query
    from tests.conftest import WORKLOADS

    def summary() -> dict[str, int]:
        return {
            "history": int(query("SELECT count(DISTINCT run_id) AS n FROM waste_budget_history").n[0]),
            "lineage": int(query("SELECT count(*) AS n FROM audit_lineage").n[0]),
            "rules": int(query("SELECT coalesce(max(audits_checked), 0) AS n FROM rule_firing_frequency").n[0]),
            "calibration": int(query("SELECT coalesce(sum(audits), 0) AS n FROM speedup_calibration").n[0]),
        }

    seen = []
    for scenario in ("fp32_on_mi300x", "no_loader_workers"):
        assert main(["audit", str(WORKLOADS / "synthetic" / scenario), "--json"]) == 0
        audit_id = json.loads(capsys.readouterr().out)["audit_id"]
        lineage = query("SELECT workload, profile_run_id FROM audit_lineage WHERE audit_id = ?", params=[audit_id])
        assert lineage.values.tolist() == [[scenario, f"{audit_id}-profile"]]
        seen.append(summary())
    assert [s["history"] for s in seen] == [1, 2] and [s["lineage"] for s in seen] == [1, 2]
    assert [s["rules"] for s in seen] == [1, 2]
    assert seen[1]["calibration"] >= seen[0]["calibration"] > 0   # both scenarios apply a rule


def test_old_and_stale_models_are_replaced_on_open(tmp_path):
    """A mart built as a table by an older release, and a view built from older SQL, are replaced when the
    warehouse opens for writing; the replacement reads the current rows."""
    db = tmp_path / "wh.duckdb"
    with connect(db) as con:
        con.execute("DROP VIEW waste_budget_history")
        con.execute("CREATE TABLE waste_budget_history AS SELECT 1 AS stale")
        con.execute("CREATE OR REPLACE VIEW rule_firing_frequency AS SELECT 1 AS stale")
    with connect(db) as con:
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
        assert kinds["waste_budget_history"] == kinds["rule_firing_frequency"] == "VIEW"
        cols = {r[0] for r in con.execute("DESCRIBE rule_firing_frequency").fetchall()}
        assert "audits_fired" in cols and "stale" not in cols
        assert con.execute("SELECT count(*) FROM waste_budget_history").fetchone()[0] == 0
