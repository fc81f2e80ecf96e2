"""The mining verbs (goblin opscope mine|infer|probes|roofline|dataflow|plan, old names as aliases) and the Dagster
mining assets: both call goblin_assets.opscope.mining, and the assets mine the runs their upstream assets produced."""
from __future__ import annotations

import json

import dagster as dg
import pandas as pd
import pytest
import torch

from goblin_assets.cli_opscope_mine import add_mining_parsers, main
from goblin_assets.defs.mining import MINING_ASSETS, opscope_patterns, plan
from goblin_assets.warehouse.db import query, write
from goblin_assets.warehouse.tables import columns
from tests.conftest import dagster_resources
from tests.test_mining_miner import record_digits


@pytest.fixture
def digits_home(goblin_home):
    df, pixels, h1 = record_digits(run_id="cli-digits")
    write({"sketches": df})
    return goblin_home, df, pixels, h1


def _run(capsys, *argv) -> list[dict]:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_mine_and_plan_verbs_on_the_latest_run(digits_home, capsys):
    _, df, pixels, _ = digits_home
    found = _run(capsys, "mine", "--json")
    assert all({"site", "role", "finding", "score", "evidence", "run_id"} <= set(f) for f in found)
    px = [f for f in found if f["site"] == "linear_0" and f["role"] == "lhs" and "density" in f["evidence"]][0]
    assert px["run_id"] == "cli-digits"
    assert px["evidence"]["density"] == pytest.approx(float((pixels != 0).double().mean()))
    assert {"finding": "sparse_gemm", "site": "linear_1", "role": "lhs"}.items() <= \
        [f for f in found if f["site"] == "linear_1" and f["role"] == "lhs" and f["finding"] == "sparse_gemm"][0].items()
    planned = _run(capsys, "plan", "--no-measure", "--json")
    assert {f["finding"] for f in planned} == {"prepack", "zero_skipping_sparse_gemm"}
    stored = query("SELECT count(*) AS n FROM plan")["n"][0]
    assert stored == len(planned)


def test_unknown_run_id_and_empty_warehouse_are_clear_errors(goblin_home, capsys):
    assert main(["mine", "--run-id", "nope"]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "table sketches: no rows for run_id 'nope'" in err and "goblin sql" in err
    assert main(["plan", "--no-measure"]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "table sketches: no recorded rows" in err and "goblin opscope sweep|seq|digits|minilm" in err
    assert main(["roofline", "--run-id", "nope"]) == 2
    assert "table runs: no run 'nope' with a trace" in capsys.readouterr().err.replace("\n", "")


def test_infer_verb_reads_recorded_route_rows(goblin_home, capsys):
    load = [0.50, 0.36, 0.09, 0.04, 0.01, 0.0]      # hot: > 2/6, cold: < 0.02
    rows = pd.DataFrame([{"run_id": "cli-moe", "workload": "moe", "model": "moe", "step": 0, "backend": "cpu",
                          "dist": "d", "M": 100, "K": 2, "N": 6, "numel": 200, "site": "blocks.0:topk_0",
                          "role": "route", "stat": "expert_load", "idx": e, "value": v} for e, v in enumerate(load)])
    write({"sketches": rows[columns("sketches")]})
    found = _run(capsys, "infer", "--json")
    cold = {f["site"] for f in found if f["finding"] == "cold_expert"}
    hot = {f["site"] for f in found if f["finding"] == "hot_expert"}
    assert cold == {"blocks.0:topk_0.expert4", "blocks.0:topk_0.expert5"}
    assert hot == {"blocks.0:topk_0.expert0", "blocks.0:topk_0.expert1"}


def test_probes_roofline_and_dataflow_verbs_and_their_old_names(goblin_home, tmp_path, capsys):
    from goblin_assets.opscope.probe import save_tensor

    g = torch.Generator().manual_seed(0)
    low = torch.randn(64, 4, generator=g) @ torch.randn(4, 96, generator=g)
    f = save_tensor(tmp_path / "t.safetensors", {"proj.weight": low, "grid.weight": torch.randint(-3, 4, (32, 32)).float()})
    found = _run(capsys, "probes", "--file", str(f), "--json", "--run-id", "cli-probe")
    got = {(p["site"], p["finding"]) for p in found}
    assert ("proj.weight", "low_rank") in got and ("grid.weight", "quantize_lut") in got
    assert query("SELECT count(*) AS n FROM probes WHERE run_id = 'cli-probe'")["n"][0] > 0

    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(32, 64), torch.randn(64, 48)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(a, b)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    roof = _run(capsys, "roofline", "--trace", str(tmp_path / "trace.json"), "--json")
    assert roof[0]["site"] == "mm 32x64x48:float" and roof[0]["evidence"]["flops"] == 2 * 32 * 64 * 48
    assert _run(capsys, "shapes", "--trace", str(tmp_path / "trace.json"), "--json")[0]["site"] == roof[0]["site"]
    assert query("SELECT count(DISTINCT run_id) AS n FROM roofline")["n"][0] == 2

    edges = ["x input -"]
    prev = "x"
    for i in range(3):                                   # three identical linear-relu-add blocks
        edges += [f"w{i} param -", f"l{i} aten.linear.default {prev},w{i}", f"r{i} aten.relu.default l{i}",
                  f"a{i} aten.add.Tensor r{i},{prev}"]
        prev = f"a{i}"
    (tmp_path / "g.txt").write_text("\n".join(edges) + "\n")
    flow = _run(capsys, "dataflow", str(tmp_path / "g.txt"), "--json")
    assert [f["evidence"] for f in _run(capsys, "graph", str(tmp_path / "g.txt"), "--json")] == \
        [f["evidence"] for f in flow]
    top = flow[0]
    assert top["finding"] == "fusion_candidate" and top["evidence"]["count"] == 3 and top["evidence"]["size"] == 3
    inner = [f for f in flow if f["evidence"]["within"] == top["evidence"]["cone_id"]]
    assert [(f["evidence"]["name"], f["evidence"]["ops"]) for f in inner] == [("fused_matmul_bias_act",
                                                                               ["relu", "linear"])]


def _report_recording(instance: dg.DagsterInstance, asset: str, run_id: str, rows: int) -> None:
    """Record a materialization of recording asset ``asset`` as defs/opscope.py reports it (run_id, row count)."""
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset, metadata={"run_id": run_id, "dagster/row_count": dg.MetadataValue.int(rows)}))


def test_mining_assets_mine_the_runs_their_upstream_assets_produced(tmp_path):
    """opscope_patterns mines the run opscope_digits reported, not the newer rows of another run; plan follows it."""
    df, _, _ = record_digits(steps=3, run_id="dg-digits")
    decoy, _, _ = record_digits(steps=2, run_id="dg-decoy")
    db = tmp_path / "w.duckdb"
    write({"sketches": df}, db)
    write({"sketches": decoy}, db)                       # written last: "the latest insertion"
    defs = dg.Definitions(assets=MINING_ASSETS, resources=dagster_resources(db))
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).is_materializable} == \
        {"opscope_patterns", "inference_dynamics", "probes", "roofline", "dataflow", "plan", "online_sketches"}
    instance = dg.DagsterInstance.ephemeral()
    _report_recording(instance, "opscope_digits", "dg-digits", len(df))
    _report_recording(instance, "opscope_seq", "dg-failed-gate", 0)      # wrote nothing: skipped
    res = dg.materialize([opscope_patterns, plan], instance=instance, resources=dagster_resources(db))
    assert res.success
    pat = query("SELECT * FROM patterns", db)
    assert set(pat.run_id) == {"dg-digits"}
    assert ("linear_1", "lhs", "sparse_gemm") in set(zip(pat.site, pat.role, pat.finding))
    planned = query("SELECT * FROM plan", db)
    assert set(planned.run_id) == {"dg-digits"}
    assert (planned.provenance == "measured").all() and (planned.measured_speedup > 0).all()
    for node, upstream in (("opscope_patterns", "opscope_digits"), ("plan", "opscope_patterns")):
        md = res.asset_materializations_for_node(node)[0].metadata
        assert md["run_ids"].value == ["dg-digits"] and upstream in md["run_ids_from"].value
    assert res.asset_materializations_for_node("plan")[0].metadata["rows_by_table"].value["plan"] == len(planned)


def test_cli_and_assets_share_one_definition_of_the_latest_run(tmp_path, goblin_home, capsys):
    """No run id and no upstream materialization: both read the run with the newest runs.created_at."""
    from datetime import datetime

    known, _, _ = record_digits(steps=2, run_id="known-run")
    unknown, _, _ = record_digits(steps=2, run_id="unknown-run")
    run = {c: None for c in columns("runs")} | {
        "run_id": "known-run", "workload": "digits", "label": "profile", "created_at": datetime.now(), "ok": True,
        "provenance": "measured", "device": "cpu", "steps": 2, "metrics_json": "{}"}
    write({"sketches": known, "runs": pd.DataFrame([run])[columns("runs")]})
    write({"sketches": unknown})                         # inserted later, but unknown to runs
    assert {f["run_id"] for f in _run(capsys, "mine", "--json")} == {"known-run"}
    res = dg.materialize([opscope_patterns], instance=dg.DagsterInstance.ephemeral(),
                         resources=dagster_resources(goblin_home / "warehouse.duckdb"))
    md = res.asset_materializations_for_node("opscope_patterns")[0].metadata
    assert md["run_ids"].value == ["known-run"] and md["run_ids_from"].value.startswith("latest run")


def test_parsers_register_every_verb_and_the_old_names():
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="verb")
    add_mining_parsers(sub)
    for verb in ("mine", "infer", "probes", "roofline", "dataflow", "plan"):
        args = p.parse_args([verb, "--run-id", "x", "--json"])
        assert args.run_id == "x" and args.json and callable(args.fn) and args.miner == verb
    for old, new in (("probe", "probes"), ("shapes", "roofline"), ("flow", "dataflow"), ("graph", "dataflow")):
        assert p.parse_args([old, "--json"]).miner == new
    assert p.parse_args(["graph", "f.txt"]).file == "f.txt"
    assert p.parse_args(["shapes", "--trace", "t.json"]).trace == "t.json"
