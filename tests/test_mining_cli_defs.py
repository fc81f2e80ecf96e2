"""The mining verbs (goblin opscope mine|infer|probe|shapes|graph|plan) and the Dagster mining assets."""
from __future__ import annotations

import json

import dagster as dg
import pandas as pd
import pytest
import torch
from dagster_duckdb import DuckDBResource

from goblin_assets.cli_opscope_mine import add_mining_parsers, main
from goblin_assets.defs.mining import MINING_ASSETS, actuation_plan, opscope_patterns
from goblin_assets.warehouse.db import query, write
from goblin_assets.warehouse.tables import columns
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
    plan = _run(capsys, "plan", "--no-measure", "--json")
    assert {f["finding"] for f in plan} == {"prepack", "zero_skipping_sparse_gemm"}
    stored = query("SELECT count(*) AS n FROM plan")["n"][0]
    assert stored == len(plan)


def test_unknown_run_id_is_a_clear_error(goblin_home, capsys):
    assert main(["mine", "--run-id", "nope"]) == 2
    assert "no rows for run_id 'nope'" in capsys.readouterr().err.replace("\n", "")


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


def test_probe_shapes_and_graph_verbs(goblin_home, tmp_path, capsys):
    from goblin_assets.opscope.probe import save_tensor

    g = torch.Generator().manual_seed(0)
    low = torch.randn(64, 4, generator=g) @ torch.randn(4, 96, generator=g)
    f = save_tensor(tmp_path / "t.safetensors", {"proj.weight": low, "grid.weight": torch.randint(-3, 4, (32, 32)).float()})
    probes = _run(capsys, "probe", "--file", str(f), "--json", "--run-id", "cli-probe")
    got = {(p["site"], p["finding"]) for p in probes}
    assert ("proj.weight", "low_rank") in got and ("grid.weight", "quantize_lut") in got
    assert query("SELECT count(*) AS n FROM probes WHERE run_id = 'cli-probe'")["n"][0] > 0

    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(32, 64), torch.randn(64, 48)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(a, b)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    shapes = _run(capsys, "shapes", "--trace", str(tmp_path / "trace.json"), "--json")
    assert shapes[0]["site"] == "mm 32x64x48:float" and shapes[0]["evidence"]["flops"] == 2 * 32 * 64 * 48

    edges = ["x input -"]
    prev = "x"
    for i in range(3):                                   # three identical linear-relu-add blocks
        edges += [f"w{i} param -", f"l{i} aten.linear.default {prev},w{i}", f"r{i} aten.relu.default l{i}",
                  f"a{i} aten.add.Tensor r{i},{prev}"]
        prev = f"a{i}"
    (tmp_path / "g.txt").write_text("\n".join(edges) + "\n")
    flow = _run(capsys, "graph", str(tmp_path / "g.txt"), "--json")
    top = flow[0]
    assert top["finding"] == "fusion_candidate" and top["evidence"]["count"] == 3 and top["evidence"]["size"] == 3
    inner = [f for f in flow if f["evidence"]["within"] == top["evidence"]["cone_id"]]
    assert [(f["evidence"]["name"], f["evidence"]["ops"]) for f in inner] == [("fused_matmul_bias_act",
                                                                               ["relu", "linear"])]


def test_mining_assets_materialize_against_duckdb(tmp_path):
    df, _, _ = record_digits(steps=3, run_id="dg-digits")
    db = tmp_path / "w.duckdb"
    write({"sketches": df}, db)
    defs = dg.Definitions(assets=MINING_ASSETS, resources={"duckdb": DuckDBResource(database=str(db))})
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).is_materializable} == \
        {"opscope_patterns", "inference_dynamics", "host_probes", "gemm_roofline", "fusion_candidates",
         "actuation_plan", "online_sketches"}
    res = dg.materialize([opscope_patterns, actuation_plan], resources={"duckdb": DuckDBResource(database=str(db))})
    assert res.success
    pat = query("SELECT * FROM patterns WHERE run_id = 'dg-digits'", db)
    assert ("linear_1", "lhs", "sparse_gemm") in set(zip(pat.site, pat.role, pat.finding))
    plan = query("SELECT * FROM plan WHERE run_id = 'dg-digits'", db)
    assert (plan.provenance == "measured").all() and (plan.measured_speedup > 0).all()
    mats = res.asset_materializations_for_node("actuation_plan")
    assert mats[0].metadata["dagster/row_count"].value == len(plan)


def test_parsers_register_every_verb():
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="verb")
    add_mining_parsers(sub)
    for verb in ("mine", "infer", "probe", "shapes", "flow", "plan"):
        args = p.parse_args([verb, "--run-id", "x", "--json"])
        assert args.run_id == "x" and args.json and callable(args.fn)
    assert p.parse_args(["graph", "f.txt"]).file == "f.txt"
