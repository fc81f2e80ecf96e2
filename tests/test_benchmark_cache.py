"""Benchmark cache: sha256 of (config JSON, script hash, image tag, runner code hash)."""
from __future__ import annotations

import shutil

from goblin_assets.audit import benchmark as B
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from tests.conftest import WORKLOADS

CFG = {"batch_size": 64, "dataloader_workers": 0}


def test_key_changes_with_each_of_the_four(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('a')\n")
    base = B.cache_key(CFG, script, steps=10)
    assert B.cache_key(dict(CFG), script, steps=10) == base                       # identical request
    assert B.cache_key({**CFG, "dataloader_workers": 2}, script, steps=10) != base  # config
    monkeypatch.setenv("GOBLIN_ROCM_IMAGE", "rocm/pytorch:other")
    assert B.cache_key(CFG, script, steps=10) != base                             # image tag
    monkeypatch.delenv("GOBLIN_ROCM_IMAGE")
    script.write_text("print('b')\n")
    assert B.cache_key(CFG, script, steps=10) != base                             # script
    script.write_text("print('a')\n")
    monkeypatch.setattr(B, "runner_code_hash", lambda: "0" * 64)
    assert B.cache_key(CFG, script, steps=10) != base                             # runner code


class CountingRunner(LocalRunner):
    calls = 0

    def run(self, *a, **kw):
        CountingRunner.calls += 1
        return super().run(*a, **kw)


def test_identical_request_hits_and_changed_script_misses(goblin_home, tmp_path):
    wl = load_workload(WORKLOADS / "digits_mlp")
    runner = CountingRunner(timeout_s=300)
    arms = {"baseline": {"config": CFG, "script": wl.script}}
    first = B.benchmark(wl, runner, arms, steps=3, repeats=1, log=lambda s: None)["baseline"]
    assert not first.cache_hit and CountingRunner.calls == 1 and first.median > 0
    again = B.benchmark(wl, runner, arms, steps=3, repeats=1, log=lambda s: None)["baseline"]
    assert again.cache_hit and CountingRunner.calls == 1
    assert again.median == first.median and again.cache_key == first.cache_key
    copy = tmp_path / "train.py"
    shutil.copy(wl.script, copy)
    copy.write_text(copy.read_text() + "\n# edited\n")
    changed = B.benchmark(wl, runner, {"baseline": {"config": CFG, "script": copy}}, steps=3, repeats=1,
                          log=lambda s: None)["baseline"]
    assert not changed.cache_hit and CountingRunner.calls == 2
