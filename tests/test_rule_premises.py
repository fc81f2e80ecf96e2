"""Rules whose premise the run contradicts do not fire: DataLoader workers on an in-memory dataset.

Workers parallelise ``__getitem__``; on a ``TensorDataset`` an item is an index into tensors already in
memory, so workers only add start-up and inter-process copies.  The harness reports the first loader's
dataset class and whether its items are in memory; the loader-workers rule reads it.
"""
from __future__ import annotations

from pathlib import Path

from goblin_assets.contracts import RunMetrics, WasteBucket
from goblin_assets.kb.rules import load_kb, match_rule
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload

TINY = Path(__file__).parent / "data" / "tiny_workload"
RULE = "data.loader_workers_with_threads"


def test_the_harness_reports_an_in_memory_dataset(goblin_home):
    raw = LocalRunner(device="cpu", timeout_s=120).run(load_workload(TINY), "benchmark", steps=2, warmup=1)
    assert raw.ok, raw.failure
    assert raw.result.dataset_in_memory is True
    assert raw.result.dataset_class == "torch.utils.data.dataset.TensorDataset"


def _context(in_memory: bool | None) -> dict:
    from goblin_assets.contracts import ConfigDict
    from goblin_assets.host import current_host
    from goblin_assets.kb.rules import detect_context

    m = RunMetrics(step_time_s=0.01, samples_per_sec=100.0, dataset_in_memory=in_memory, waste_budget={
        "useful": WasteBucket(seconds=0.004, status="measured"),
        "data_wait": WasteBucket(seconds=0.006, status="measured")})
    return detect_context(ConfigDict(batch_size=32, dataloader_workers=0), m, current_host(), cores=8)


def test_the_loader_workers_rule_does_not_fire_on_an_in_memory_dataset():
    rule = load_kb().by_id[RULE]
    assert match_rule(rule, _context(False)).fired          # a dataset that does work per item: more workers
    assert match_rule(rule, _context(None)).fired           # not reported (an older recording): as before
    assert not match_rule(rule, _context(True)).fired   # a TensorDataset: workers would only add cost
