"""Opscope drivers on real values: sweep distributions, decode sequence, digits MLP, writing, CLI, Dagster asset."""
from __future__ import annotations

import argparse
import gzip
import json
import struct

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from goblin_assets.cli_opscope import add_opscope_parser
from goblin_assets.defs.opscope import OPSCOPE_ASSETS
from goblin_assets.opscope.drivers import (
    DISTRIBUTIONS, OUTLIER_SCALE, RELU_SPARSE_DENSITY, DriverError, digits, load_mnist, seq, sweep, write_result,
)
from goblin_assets.opscope.record import SKETCH_COLUMNS
from goblin_assets.warehouse.db import query, validate
from tests.conftest import dagster_resources


#: Many small reductions: on 2 shared cores, 2 intra-op threads make them ~7x slower (measured).
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def scalar(rows: pd.DataFrame, stat: str, **where) -> pd.Series:
    m = (rows.stat == stat) & (rows.idx == 0)
    for k, v in where.items():
        m &= rows[k] == v
    return rows[m].set_index("step")["value"]


@pytest.fixture(scope="module")
def sweep_run():
    return sweep(steps=2, shapes=((64, 128, 64), (512, 256, 128)))


def test_sweep_rows_are_tidy_and_gated_everywhere(sweep_run):
    r = sweep_run
    assert list(r.rows.columns) == SKETCH_COLUMNS
    validate("sketches", r.rows)
    assert set(r.rows.dist) == set(DISTRIBUTIONS) and r.sites == ["gemm_64x128x64", "gemm_512x256x128"]
    assert r.gate_passed and len(r.gates) == 2 * (1 + len(DISTRIBUTIONS))
    big = r.rows[r.rows.site == "gemm_512x256x128"]
    assert set(big.M) == {512} and set(big.K) == {256} and set(big.N) == {128}
    assert set(r.rows.role) == {"lhs", "rhs", "out"}


def test_sweep_real_values_match_their_construction(sweep_run):
    rows = sweep_run.rows
    site = "gemm_512x256x128"

    def stat(dist, s, role="lhs"):
        return scalar(rows, s, dist=dist, site=site, role=role).mean()

    numel = 512 * 256
    assert stat("relu-sparse", "nnz") / numel == pytest.approx(RELU_SPARSE_DENSITY, abs=0.01)
    assert stat("gaussian", "nnz") / numel == 1.0
    assert stat("outlier-channel", "chan_outlier") > 6 > stat("gaussian", "chan_outlier")
    assert stat("outlier-channel", "max") > 0.5 * OUTLIER_SCALE * 3
    assert stat("gaussian", "kurtosis") == pytest.approx(3.0, abs=0.1)
    assert stat("uniform", "kurtosis") == pytest.approx(1.8, abs=0.05)
    assert stat("heavy-tailed", "kurtosis") > 10
    assert stat("uniform", "min") >= -1 and stat("uniform", "max") <= 1
    grid = rows[(rows.dist == "quantised-grid") & (rows.site == site) & (rows.role == "lhs")]
    samples = grid[grid.stat == "sample"].value.to_numpy()
    np.testing.assert_allclose(samples / 0.25, np.round(samples / 0.25))       # on the 0.25 grid
    hist = grid[grid.stat == "hist"].groupby("idx").value.mean()
    assert (hist > 0).sum() <= 16                                                # 16 levels
    # the weights are fixed: rhs sketches are identical across steps and distributions
    rhs_l1 = rows[(rows.site == site) & (rows.role == "rhs") & (rows.stat == "l1")].value
    assert rhs_l1.nunique() == 1


def test_seq_weights_stationary_activations_drift():
    r = seq(steps=4, batch=4, d_model=64)
    validate("sketches", r.rows)
    assert r.sites == ["up", "down"] and r.gate_passed and sorted(r.rows.step.unique()) == [0, 1, 2, 3]
    w = scalar(r.rows, "l1", site="up", role="rhs")
    a = scalar(r.rows, "l1", site="up", role="lhs")
    assert w.nunique() == 1 and a.nunique() == 4
    assert (scalar(r.rows, "M", site="up", role="lhs").empty)   # M is a column, not a stat
    assert set(r.rows[r.rows.site == "up"].M) == {4}


def test_progress_is_reported_about_ten_times_per_run():
    lines: list[str] = []
    seq(steps=25, batch=2, d_model=16, progress=lines.append)
    assert lines == [f"seq: step {s}/25 recorded" for s in (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)]
    lines.clear()
    seq(steps=3, batch=2, d_model=16, progress=lines.append)   # short runs: every step
    assert lines == [f"seq: step {s}/3 recorded" for s in (1, 2, 3)]
    lines.clear()
    sweep(steps=1, shapes=((8, 16, 8),), dists=("gaussian", "relu-sparse"), progress=lines.append)
    assert lines == ["sweep: GEMM 8x16x8, gaussian recorded (1/2, 1 steps each)",
                     "sweep: GEMM 8x16x8, relu-sparse recorded (2/2, 1 steps each)"]
    lines.clear()
    digits(steps=2, progress=lines.append)
    assert [ln.split(" (loss ")[0] for ln in lines] == ["digits: step 1/2 recorded", "digits: step 2/2 recorded"]


@pytest.fixture(scope="module")
def digits_run():
    return digits(steps=4)


def test_digits_densities_on_real_pixels(digits_run):
    r = digits_run
    validate("sketches", r.rows)
    assert r.sites == ["fc1", "fc2", "fc3"] and r.gate_passed
    s = r.summary.set_index(["site", "role"])
    assert s.loc[("fc1", "lhs"), "density"] < 0.7                      # pixel density (about 0.51)
    assert s.loc[("fc1", "lhs"), "density"] == pytest.approx(0.51, abs=0.05)
    assert s.loc[("fc2", "lhs"), "density"] < 0.6                      # post-ReLU activations
    assert s.loc[("fc3", "lhs"), "density"] < 0.6
    assert s.loc[("fc1", "rhs"), "density"] == 1.0
    assert s.loc[("fc1", "lhs"), "absmax"] <= 1.0
    # SGD updates the weights: their l1 drifts across steps
    assert scalar(r.rows, "l1", site="fc1", role="rhs").nunique() == 4
    assert r.extra["losses"][-1] < r.extra["losses"][0]


def test_digits_without_optimizer_keeps_weights_stationary():
    r = digits(steps=2, train=False)
    assert scalar(r.rows, "l1", site="fc2", role="rhs").nunique() == 1


def _write_idx(path, arr: np.ndarray, code: int) -> None:
    head = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    path.write_bytes(gzip.compress(head + arr.astype(">u1" if code == 0x08 else arr.dtype).tobytes()))


def test_mnist_folder_in_torchvision_layout(tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    imgs = np.kron(d.images[:200], np.ones((3, 3))) / 16 * 255          # real digits, 24x24, uint8 range
    _write_idx(raw / "train-images-idx3-ubyte.gz", imgs.astype(np.uint8), 0x08)
    _write_idx(raw / "train-labels-idx1-ubyte.gz", d.target[:200].astype(np.uint8), 0x08)
    images, labels = load_mnist(tmp_path)
    assert images.shape == (200, 24, 24) and labels[:5].tolist() == d.target[:5].tolist()
    r = digits(steps=1, batch=32, mnist=tmp_path)
    assert r.rows.dist.unique().tolist() == ["mnist"] and set(r.rows[r.rows.site == "fc1"].K) == {576}
    with pytest.raises(DriverError, match="no train-images-idx3-ubyte"):
        load_mnist(tmp_path / "nowhere")
    (raw / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x03" + b"\x00" * 8))
    with pytest.raises(DriverError, match="truncated IDX file"):
        load_mnist(tmp_path)


def test_write_result_one_transaction_and_parquet(digits_run, tmp_path):
    db = tmp_path / "wh.duckdb"
    pqf = tmp_path / "out" / "digits.parquet"
    n = write_result(digits_run, db, parquet=pqf)
    assert n == len(digits_run.rows)
    got = query(f"SELECT count(*) n, count(DISTINCT site) s FROM sketches WHERE run_id = '{digits_run.run_id}'", db)
    assert int(got.n[0]) == n and int(got.s[0]) == 3
    assert pq.read_table(pqf).num_rows == n and pq.read_table(pqf).column_names == SKETCH_COLUMNS


def test_cli_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBLIN_HOME", str(tmp_path / "home"))
    p = argparse.ArgumentParser(prog="goblin")
    add_opscope_parser(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["opscope", "seq", "--steps", "3", "--json", "--parquet", str(tmp_path / "s.parquet")])
    assert args.fn(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"run_id", "rows", "sites", "gate_passed", "summary"} <= set(doc)
    assert doc["gate_passed"] is True and doc["sites"] == ["up", "down"] and doc["rows"] > 0
    assert {"site", "role", "density", "absmax", "mean"} <= set(doc["summary"][0])
    assert query("SELECT count(*) n FROM sketches").n[0] == doc["rows"]
    args = p.parse_args(["opscope", "seq", "--steps", "1"])
    assert args.fn(args) == 0 and "correctness gate passed" in capsys.readouterr().out.replace("\n", " ")
    with pytest.raises(SystemExit):
        p.parse_args(["opscope", "sweep", "--shapes", "12x3"])


def test_asset_materializes_in_process(tmp_path):
    db = tmp_path / "wh.duckdb"
    res = dg.materialize(
        OPSCOPE_ASSETS, selection=["opscope_seq"], instance=dg.DagsterInstance.ephemeral(),
        resources=dagster_resources(db, device="cpu"),
        run_config={"ops": {"opscope_seq": {"config": {"steps": 2}}}})
    assert res.success
    meta = res.asset_materializations_for_node("opscope_seq")[0].metadata
    assert meta["gate_passed"].value is True and meta["sites"].value == ["up", "down"]
    assert meta["dagster/row_count"].value == int(query("SELECT count(*) n FROM sketches", db).n[0]) > 0
    assert {a.key.to_user_string() for a in OPSCOPE_ASSETS} == {"opscope_sweep", "opscope_seq", "opscope_digits",
                                                                 "opscope_minilm"}
    assert all(a.group_names_by_key[a.key] == "opscope" for a in OPSCOPE_ASSETS)
