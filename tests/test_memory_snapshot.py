"""``goblin memory``: a memory snapshot read safely, its totals equal torch's own ``_memory_viz``, the OOM explained.

The shipped snapshot (tests/data/memory_snapshots/digits_mlp_oom.pickle) is GENERATED, not recorded on a GPU:
a CPU profile's real allocations replayed through a model of the CUDA caching allocator (see
make_cpu_snapshot.py).  A second snapshot is made here by torch's own converter from a fresh CPU profile.
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import re
from pathlib import Path

import pytest

from goblin_assets.cli import main
from goblin_assets.trace.memory_snapshot import (
    SnapshotError,
    UnsafeSnapshotError,
    analyze_snapshot,
    classify_frames,
    load_snapshot,
)

SNAPSHOT = Path(__file__).parent / "data" / "memory_snapshots" / "digits_mlp_oom.pickle"
MIB = 1 << 20


def _segsum_totals(snap: dict) -> dict[str, str]:
    """torch.cuda._memory_viz.segsum's printed totals (it also asserts its own accounting)."""
    from torch.cuda._memory_viz import segsum

    text = segsum(copy.deepcopy(snap))
    return dict(re.findall(r"^(total_reserved|total_allocated|total_free|segments): (.+)$", text, re.M))


def _expected(rep) -> dict[str, str]:
    from torch.cuda._memory_viz import Bytes, _report_free

    t = rep.totals
    return {"segments": str(t["segments"]), "total_reserved": repr(Bytes(t["reserved_bytes"])),
            "total_allocated": repr(Bytes(t["allocated_bytes"])),
            "total_free": _report_free(t["free_external_bytes"], t["free_internal_bytes"])}


@pytest.fixture(scope="module")
def profiled_snapshot(tmp_path_factory) -> Path:
    """A snapshot written by torch's own ``_profile_to_snapshot`` from a real CPU profile of two Adam steps."""
    import torch
    from torch.cuda._memory_viz import _profile_to_snapshot

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    path = tmp_path_factory.mktemp("snap") / "profiled.pickle"
    path.write_bytes(pickle.dumps(_profile_to_snapshot(prof)))
    return path


@pytest.mark.parametrize("which", ["shipped", "profiled"])
def test_totals_equal_torchs_memory_viz(which, profiled_snapshot):
    path = SNAPSHOT if which == "shipped" else profiled_snapshot
    rep = analyze_snapshot(path)
    snap = load_snapshot(path)
    assert _segsum_totals(snap) == _expected(rep)
    from torch.cuda._memory_viz import calc_active

    assert rep.tables["segments"]["active_bytes"].tolist() == [
        sum(b["size"] for b in s["blocks"] if b["state"] in ("active_allocated", "active_awaiting_free"))
        for s in snap["segments"]]
    assert sum(calc_active(s) for s in snap["segments"]) == rep.totals["active_bytes"]
    t = rep.totals
    assert t["reserved_minus_allocated_bytes"] == t["free_internal_bytes"] + t["free_external_bytes"]
    assert rep.tables["frames"]["bytes"].sum() == t["allocated_bytes"] == rep.tables["categories"]["bytes"].sum()


def test_the_oom_is_explained_against_each_segments_largest_free_block():
    rep = analyze_snapshot(SNAPSHOT)
    t, oom, segs = rep.totals, rep.tables["ooms"], rep.tables["segments"]
    assert t["oom_events"] == 1 and oom["request_bytes"].iloc[0] == 16 * MIB
    assert not segs["fits_failed_request"].any()                  # no segment's largest free block holds 16 MiB
    assert (segs["largest_free_block_bytes"] < 16 * MIB).all() and t["largest_free_block_bytes"] == 4 * MIB
    assert "out of memory: a request of 16.0 MiB failed" in rep.diagnosis[0] and "forward" in rep.diagnosis[0]
    assert rep.diagnosis[1].startswith("split free memory")     # 13.1 MiB cached + 6 MiB on the device, neither alone
    cats = rep.tables["categories"].set_index("category")
    assert cats.loc["activation", "category_source"] == "recorded" and cats["bytes"].idxmax() == "activation"
    assert rep.tables["frames"]["frame"].iloc[0].endswith(" forward")
    tl = rep.tables["timeline"]
    assert "oom" in set(tl["action"]) and tl["allocated_bytes"].iloc[-1] == t["active_bytes"]
    assert tl["reserved_bytes"].iloc[-1] == t["reserved_bytes"] and (tl["allocated_bytes"] >= 0).all()
    assert rep.notes["origin"].startswith("generated, not recorded")


def test_fragmentation_and_estimated_categories(tmp_path):
    """A smaller failed request that the cache's free bytes exceed but no block holds reads as fragmentation; a
    snapshot without categories (as CUDA writes them) gets them from the allocating phase, marked estimated."""
    snap = load_snapshot(SNAPSHOT)
    snap["device_traces"][0][-1]["size"] = 8 * MIB
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            b.pop("category", None)
    for e in snap["device_traces"][0]:
        e.pop("category", None)
    path = tmp_path / "frag.pickle"
    path.write_bytes(pickle.dumps(snap))
    rep = analyze_snapshot(path)
    assert rep.diagnosis[1].startswith("fragmentation: the cache held 13.1 MiB free") and "expandable_segments" in \
        rep.diagnosis[1]
    cats = rep.tables["categories"].set_index("category")
    assert set(cats["category_source"]) == {"estimated"}
    recorded = analyze_snapshot(SNAPSHOT).tables["categories"].set_index("category")["bytes"]
    assert cats.loc["forward", "bytes"] == recorded["activation"]
    assert cats.loc["optimizer_step", "bytes"] == recorded["optimizer_state"]
    assert cats.loc["model_load", "bytes"] == recorded["parameter"]
    assert classify_frames([]) == "unknown"


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_malicious_pickle_is_refused_without_running(tmp_path, capsys):
    marker = tmp_path / "pwned"
    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Exploit(marker)]]}))
    assert not marker.exists()
    with pytest.raises(UnsafeSnapshotError, match=r"evil\.pickle: refused: the pickle names (posix|os)\.system"):
        load_snapshot(bad)
    assert main(["memory", str(bad), "--no-warehouse"]) == 2
    err = capsys.readouterr()
    assert "refused" in err.out + err.err and "Traceback" not in err.out + err.err
    assert not marker.exists()
    pickle.loads(bad.read_bytes())  # the control: an ordinary unpickler does run it
    assert marker.exists()


def test_bad_files_are_clear_errors(tmp_path):
    (tmp_path / "junk.pickle").write_bytes(b"not a pickle")
    (tmp_path / "list.pickle").write_bytes(pickle.dumps({"segments": "x"}))
    (tmp_path / "seg.pickle").write_bytes(pickle.dumps({"segments": [{"size": 1}]}))
    for name, msg in (("junk", "not a memory snapshot pickle"), ("list", "expected a dict with a 'segments' list"),
                      ("seg", r"segments\[0\] is not a segment"), ("missing", "cannot read")):
        with pytest.raises(SnapshotError, match=msg):
            load_snapshot(tmp_path / f"{name}.pickle")


def test_cli_json_html_warehouse_and_the_dagster_asset(goblin_home, tmp_path, monkeypatch, capsys):
    import dagster as dg

    from goblin_assets.defs.memory import memory_snapshot, snapshot_names, snapshots_partitions
    from goblin_assets.defs.resources import warehouse_resource
    from goblin_assets.warehouse.db import query

    html = tmp_path / "m.html"
    assert main(["memory", str(SNAPSHOT), "--json", "--html", str(html)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["oom_events"] == 1 and doc["ooms"][0]["request_bytes"] == 16 * MIB
    assert doc["html_path"] == str(html) and "data:image/png;base64," in html.read_text()
    rows = query("SELECT reserved_bytes, oom_request_bytes FROM memory_snapshots WHERE snapshot_id = 'digits_mlp_oom'")
    assert rows.iloc[0].tolist() == [doc["totals"]["reserved_bytes"], 16 * MIB]
    key = "run1/oom.pickle"  # a partition per file under $GOBLIN_SNAPSHOTS, sub-folders kept in the key
    (tmp_path / "snaps" / key).parent.mkdir(parents=True)
    (tmp_path / "snaps" / key).write_bytes(SNAPSHOT.read_bytes())
    monkeypatch.setenv("GOBLIN_SNAPSHOTS", str(tmp_path / "snaps"))
    assert snapshot_names() == [key]
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(snapshots_partitions.name, snapshot_names())
    res = dg.materialize([memory_snapshot], partition_key=key, instance=instance,
                         resources={"warehouse": warehouse_resource()})
    assert res.success
    meta = res.asset_materializations_for_node("memory_snapshot")[0].metadata
    assert meta["oom_events"].value == 1 and "16.0 MiB" in meta["diagnosis"].value
    n = query("SELECT count(*) AS n FROM memory_snapshot_segments WHERE snapshot_id = 'run1/oom.pickle'")
    assert n["n"].iloc[0] == 3


def test_the_user_frame_skips_the_native_frames_of_a_snapshot_recorded_with_all_stacks():
    """``_record_memory_history(stacks="all")`` records C++ frames innermost (the unwinder, the caching allocator,
    ATen's dispatch), then the Python ones: the frame a person reads is the first Python line outside the
    libraries (the frame names below are torch's own, as a real CUDA snapshot shows them)."""
    from goblin_assets.trace.memory_snapshot import user_frame

    frames = [{"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
              {"name": "torch::cuda::(anonymous namespace)::gather_with_cpp()", "filename": "memory_snapshot.cpp",
               "line": 0},
              {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, "
                       "CUstream_st*)", "filename": "CUDACachingAllocator.cpp", "line": 0},
              {"name": "at::empty_strided(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions)",
               "filename": "", "line": 0},
              {"name": "torch::autograd::THPVariable_to(_object*, _object*, _object*)",
               "filename": "python_variable_methods.cpp", "line": 0},
              {"name": "_PyObject_GetMethod", "filename": "??", "line": 0},
              {"name": "to", "filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1340},
              {"name": "train_step", "filename": "/home/me/train.py", "line": 102},
              {"name": "<module>", "filename": "/home/me/train.py", "line": 218}]
    assert user_frame(frames) == "/home/me/train.py:102 train_step"
