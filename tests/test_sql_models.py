"""SQL models: lineage parsed from the SQL, built as views/tables over real warehouse rows."""
from __future__ import annotations

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
