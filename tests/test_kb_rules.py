"""The knowledge base file: schema, coverage, citations, guardrails, and clear errors for bad files."""
from __future__ import annotations

import argparse
import copy
from collections import Counter
from pathlib import Path

import pytest
import yaml

from goblin_assets.cli_kb import add_kb_parser
from goblin_assets.contracts import CONFIG_FIELDS, WASTE_BUCKETS, Rule
from goblin_assets.errors import KBError
from goblin_assets.kb.rules import DEFAULT_KB, PROFILER_ENV, WARNED_FIX, _check_condition_paths, load_kb, version_tuple

CATEGORIES = set(Rule.model_fields["category"].annotation.__args__)

#: Profiler and debug variables a fix must never set (kb_facts G01, G02), spelled out
#: so the guard does not depend only on the PROFILER_ENV pattern it checks.
FORBIDDEN_TO_SET = [
    "ROCPROFSYS_TRACE", "ROCPROFSYS_PROFILE", "ROCPROFSYS_USE_SAMPLING", "HIP_LAUNCH_BLOCKING",
    "CUDA_LAUNCH_BLOCKING", "AMD_SERIALIZE_KERNEL", "AMD_SERIALIZE_COPY", "PYTORCH_NO_HIP_MEMORY_CACHING",
    "PYTORCH_NO_CUDA_MEMORY_CACHING", "TORCH_COMPILE_DEBUG", "PYTORCH_TUNABLEOP_VERBOSE", "HIPBLASLT_LOG_LEVEL",
    "HIPBLASLT_LOG_MASK", "HIPBLASLT_ENABLE_MARKER", "MIOPEN_ENABLE_LOGGING", "MIOPEN_LOG_LEVEL",
    "MIOPEN_CHECK_NUMERICS", "HIP_FORCE_QUEUE_PROFILING", "HSA_TOOLS_LIB", "HSA_ENABLE_DEBUG",
    "HSA_DISABLE_FRAGMENT_ALLOCATOR",
]


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def test_kb_loads_with_enough_rules_across_categories_and_platforms(kb):
    assert len(kb.rules) >= 34
    per_cat = Counter(r.category for r in kb.rules)
    assert set(per_cat) == CATEGORIES, f"categories missing: {CATEGORIES - set(per_cat)}"
    per_platform = Counter(p for r in kb.rules for p in r.platforms)
    assert per_platform["rocm"] > len(kb.rules) / 2  # most rules are for MI300X/ROCm
    assert per_platform["cuda"] >= 5 and per_platform["cpu"] >= 5
    assert len(kb.sha256) == 64


def test_every_rule_has_a_real_citation_and_parseable_versions(kb):
    for r in kb.rules:
        assert r.citation.url.startswith("https://"), r.id
        assert r.citation.title.strip() and r.citation.section.strip(), r.id
        assert len(r.symptom.split()) >= 8, f"{r.id}: symptom too short to retrieve on"
        for v in (r.torch_version_min, r.rocm_version_min):
            assert v is None or version_tuple(v) is not None, r.id


def test_rules_read_and_write_only_fields_that_exist(kb):
    for r in kb.rules:
        assert r.targets_bucket in WASTE_BUCKETS, r.id
        assert set(r.fix.config) <= set(CONFIG_FIELDS) | {WARNED_FIX}, r.id   # "*": the fields a warning names
        if r.kind == "tuning":
            assert r.fix.config or r.fix.env or r.fix.unset_env or r.fix.keywords, f"{r.id}: a rule needs a transform"
        assert r.detect, f"{r.id}: a rule needs detect conditions"
        for cond in r.detect:
            assert _check_condition_paths(cond) is None, (r.id, cond)


def test_guard_no_rule_sets_a_profiler_or_debug_variable(kb):
    for r in kb.rules:
        for var in r.fix.env:
            assert not var.startswith("ROCPROFSYS_"), f"{r.id} sets {var}"
            assert not PROFILER_ENV.match(var), f"{r.id} sets profiler/debug variable {var}"
            assert var not in FORBIDDEN_TO_SET, f"{r.id} sets {var}"
    for var in FORBIDDEN_TO_SET:
        assert PROFILER_ENV.match(var), f"PROFILER_ENV does not cover {var}"
    # unsetting debug switches is the point of some rules; profiler variables are a warning, never a fix
    assert any(PROFILER_ENV.match(v) for r in kb.rules for v in r.fix.unset_env)
    assert not any(v.startswith("ROCPROFSYS_") for r in kb.rules for v in r.fix.unset_env)


def test_rules_the_cpu_workloads_depend_on_are_unchanged(kb):
    loader = kb.by_id["data.loader_workers_with_threads"]
    assert loader.detect == ["waste.data_wait.share > 0.30", "config.dataloader_workers < cores",
                             "metrics.dataset_in_memory != true"]
    assert loader.fix.config == {"dataloader_workers": "=min(cores, 8)",
                                 "intra_op_threads": "=max(1, cores - dataloader_workers)"}
    assert kb.by_id["data.dynamic_padding"].fix.config == {"padding": "dynamic", "group_by_length": True}
    assert kb.by_id["attention.eager_to_sdpa"].fix.config == {"attention_impl": "sdpa"}


# ------------------------------------------------------------------ bad files

def _one_rule() -> dict:
    doc = yaml.safe_load(DEFAULT_KB.read_text())
    return copy.deepcopy(next(r for r in doc["rules"] if r["id"] == "env_vars.hip_force_dev_kernarg"))


def _mutate(rule: dict, path: str, value) -> dict:
    *parents, leaf = path.split(".")
    cur = rule
    for p in parents:
        cur = cur.setdefault(p, {})
    if value is _DELETE:
        del cur[leaf]
    else:
        cur[leaf] = value
    return rule


_DELETE = object()

BAD = [
    ("citation", _DELETE, ["citation", "Field required"]),
    ("citation.url", _DELETE, ["citation.url"]),
    ("recovery_fraction", 1.5, ["recovery_fraction"]),
    ("category", "vibes", ["category"]),
    ("platforms", ["tpu"], ["platforms"]),
    ("detect", ["config.learning_rate > 0.1"], ["detect", "learning_rate"]),
    ("detect", ["waste.idle.share > 0.1"], ["detect", "waste.<bucket>"]),
    ("detect", ["the gpu is slow"], ["detect", "cannot parse"]),
    ("fix.env", {"ROCPROFSYS_TRACE": "1"}, ["fix.env", "ROCPROFSYS_TRACE"]),
    ("fix.env", {"CUDA_LAUNCH_BLOCKING": "1"}, ["fix.env", "CUDA_LAUNCH_BLOCKING"]),
    ("fix.config", {"learning_rate": 1e-4}, ["fix.config", "learning_rate"]),
    ("targets_bucket", "idle", ["targets_bucket"]),
    ("rocm_version_min", "latest", ["rocm_version_min"]),
    ("fix.env", {"HIP_FORCE_DEV_KERNARG": 1}, ["fix.env.HIP_FORCE_DEV_KERNARG"]),
]


@pytest.mark.parametrize("path,value,expect", BAD, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(BAD)])
def test_bad_rule_gives_kberror_naming_rule_and_field(tmp_path: Path, path, value, expect):
    rule = _mutate(_one_rule(), path, value)
    f = tmp_path / "kb.yaml"
    f.write_text(yaml.safe_dump({"rules": [rule]}))
    with pytest.raises(KBError) as ei:
        load_kb(f)
    msg = str(ei.value)
    assert "rule env_vars.hip_force_dev_kernarg" in msg and str(f) in msg
    for part in expect:
        assert part in msg, msg


def test_bad_files_as_a_whole(tmp_path: Path):
    f = tmp_path / "kb.yaml"
    f.write_text("rules: [\n  - id: x\n")  # broken YAML
    with pytest.raises(KBError, match="cannot read"):
        load_kb(f)
    f.write_text(yaml.safe_dump({"rules": []}))
    with pytest.raises(KBError, match="rules:"):
        load_kb(f)
    r = _one_rule()
    f.write_text(yaml.safe_dump({"rules": [r, r]}))
    with pytest.raises(KBError, match="duplicate id"):
        load_kb(f)


# ------------------------------------------------------------------ goblin kb check

def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="goblin")
    add_kb_parser(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(argv)
    return args.fn(args)


def test_kb_check_prints_counts_per_category(kb, capsys):
    assert _run(["kb", "check"]) == 0
    text = capsys.readouterr().out
    for cat, n in Counter(r.category for r in kb.rules).items():
        assert cat in text
    assert str(len(kb.rules)) in text


def test_kb_check_exits_2_with_the_kberror(tmp_path: Path, capsys):
    f = tmp_path / "kb.yaml"
    f.write_text(yaml.safe_dump({"rules": [_mutate(_one_rule(), "recovery_fraction", 2)]}))
    assert _run(["kb", "check", "--kb", str(f)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "env_vars.hip_force_dev_kernarg" in err and "recovery_fraction" in err


def test_goblin_kb_names_the_rules_every_front_door_loads(monkeypatch, loader_rule_kb):
    """``$GOBLIN_KB`` replaces the packaged rules where no path is given; an explicit path still wins."""
    from goblin_assets.kb.rules import load_kb

    shipped = load_kb()
    monkeypatch.setenv("GOBLIN_KB", str(loader_rule_kb))
    theirs = load_kb()
    assert theirs.path == loader_rule_kb and theirs.sha256 != shipped.sha256
    assert "waste.data_wait.share > 0.0" in theirs.by_id["data.loader_workers_with_threads"].detect
    assert load_kb(shipped.path).sha256 == shipped.sha256
