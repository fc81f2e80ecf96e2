"""Semantic rule search: recall on symptoms as users write them, and the warehouse embedding cache."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from goblin_assets.audit import retrieval
from goblin_assets.audit.kb import load_kb
from goblin_assets.cli_kb import add_kb_parser
from goblin_assets.contracts import ConfigDict, RunMetrics, WasteBucket
from goblin_assets.warehouse.db import connect, query, write

#: (what a user says, the rule it should surface in the top 5)
CASES = [
    ("GPU sits idle between steps waiting for the next batch from the dataloader",
     "data.loader_workers_with_threads"),
    ("my training loop is starved by data augmentation, CPU preprocessing is the bottleneck",
     "data.loader_workers_with_threads"),
    ("GPU sits idle between steps", "data.async_loading_on_gpu"),
    ("most tokens in my batches are padding because I pad everything to max_length", "data.dynamic_padding"),
    ("too many dataloader workers for the number of CPU cores, oversubscribed", "data.loader_workers_oversubscribed"),
    ("attention is computed with separate matmul and softmax, no flash kernel shows up", "attention.eager_to_sdpa"),
    ("flash_attention_2 fails to import, flash_attn package not installed", "attention.flash_attn_missing_use_sdpa"),
    ("flash attention requested but the model is in float32", "attention.flash_needs_half_precision"),
    ("loss goes NaN in half precision", "precision.fp16_to_bf16"),
    ("training is in full fp32 on MI300X and way slower than the bf16 peak", "precision.bf16_on_mi300x"),
    ("fp32 matmuls on my A100 are slow, tensor cores not used", "precision.tf32_for_fp32_matmuls"),
    ("CPU training in fp32 on Sapphire Rapids with AMX", "precision.cpu_bf16_amx"),
    ("optimizer step launches hundreds of tiny kernels per parameter", "optimizer.fused_adamw"),
    ("8-bit Adam from bitsandbytes on AMD GPU is flaky, old bitsandbytes version",
     "optimizer.bnb_before_official_rocm_support"),
    ("paged AdamW optimizer but there is plenty of free GPU memory", "optimizer.paged_without_memory_pressure"),
    ("someone left HIP_LAUNCH_BLOCKING=1 in the job script", "env_vars.unset_debug_serialization"),
    ("CUDA_LAUNCH_BLOCKING is set and everything runs synchronously", "env_vars.unset_cuda_launch_blocking"),
    ("lots of tiny kernels and launch latency on MI300X, kernel argument overhead", "env_vars.hip_force_dev_kernarg"),
    ("ROCPROFSYS_TRACE and sampling variables are set in my production training env", "env_vars.unset_rocprofsys"),
    ("hipBLASLt log level is set and prints every gemm", "env_vars.unset_hipblaslt_logging"),
    ("AMD_SERIALIZE_KERNEL=3 is set", "env_vars.unset_amd_serialize_kernel"),
    ("gradient checkpointing on but the GPU memory is mostly empty", "memory.gradient_checkpointing_without_pressure"),
    ("CUDA out of memory even though lots of memory is reserved but unallocated, fragmentation",
     "memory.expandable_segments"),
    ("GEMMs dominate the profile, can I tune the matmul kernels for my shapes on ROCm",
     "kernels.tunableop_gemm_bound"),
    ("TORCH_BLAS_PREFER_HIPBLASLT is 0 and linear layers are slow", "kernels.hipblaslt_not_preferred"),
    ("conv layers slow on ROCm with MIOPEN_FIND_MODE=FAST", "kernels.miopen_fast_find_mode"),
    ("model runs eagerly, not compiled, lots of small pointwise kernels", "compile.enable_inductor_launch_bound"),
    ("CPU cannot launch kernels fast enough, want CUDA graphs", "compile.cuda_graphs_reduce_overhead"),
    ("TORCH_COMPILE_DEBUG left on and compilation takes forever", "compile.unset_compile_debug"),
    ("all-reduce is slow on a single 8 GPU MI300X node, RCCL channels", "collectives.rccl_min_channels_8gpu"),
    ("FSDP communication does not overlap with compute on ROCm", "collectives.fsdp_stream_priority"),
    ("running on only 2 of the 8 MI300X GPUs in the node", "topology.partial_node_on_mi300x"),
    ("job pinned with numactl but ROCm helper threads run on all cores", "topology.rocm_helper_threads_affinity"),
    ("set_num_threads is larger than the CPUs in my container", "topology.threads_exceed_pinned_cpus"),
]


@pytest.fixture(scope="module")
def kb():
    return load_kb()


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """A private GOBLIN_HOME so the embedding cache lands in a temporary warehouse."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("goblin_home")
    mp.setenv("GOBLIN_HOME", str(home))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    retrieval._index_memo.clear()
    yield home
    retrieval._index_memo.clear()
    mp.undo()


def test_cases_name_real_rules(kb):
    assert len(CASES) >= 25
    assert {want for _, want in CASES} <= set(kb.by_id)


def test_recall_at_5(kb, warehouse):
    misses = []
    all_scores = retrieval.retrieval_scores_many(retrieval.index_for(kb), [text for text, _ in CASES])  # one batch
    for (text, want), scores in zip(CASES, all_scores):
        got = sorted(scores, key=lambda rid: -scores[rid])[:5]
        if want not in got:
            misses.append((text, want, got))
    recall = 1 - len(misses) / len(CASES)
    assert recall >= 0.9, f"recall@5 {recall:.2f}; misses: {misses}"


def test_query_is_ranked_and_scores_cover_every_rule(kb, warehouse):
    hits = retrieval.query_rocm_kb("GPU sits idle between steps", top_k=7, kb=kb)
    scores = [s for _, s in hits]
    assert len(hits) == 7 and scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    all_scores = retrieval.retrieval_scores(retrieval.index_for(kb), "GPU sits idle between steps")
    assert set(all_scores) == set(kb.by_id)
    assert max(all_scores.values()) == pytest.approx(scores[0], abs=1e-5)


def test_run_symptoms_names_the_big_buckets():
    m = RunMetrics(waste_budget={"useful": WasteBucket(seconds=0.4), "data_wait": WasteBucket(seconds=0.6)},
                   padding_share=0.5)
    text = retrieval.run_symptoms(ConfigDict(attention_impl="eager"), m)
    assert "data loader" in text and "padding" in text and "eager" in text


def test_kb_search_json(kb, warehouse, capsys):
    p = argparse.ArgumentParser(prog="goblin")
    add_kb_parser(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(["kb", "search", "loss goes NaN in half precision", "--top-k", "3", "--json"])
    assert args.fn(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out) == 3
    for row in out:
        assert {"id", "score", "category", "symptom", "fix", "citation"} <= set(row)
        assert row["citation"]["url"].startswith("https://")
        assert row["fix"] == {k: v for k, v in kb.by_id[row["id"]].fix.model_dump().items() if v}
    # the search filled the warehouse's embedding cache for this KB version (retrieval itself never opens it)
    with connect() as con:
        n = con.execute("SELECT count(*) FROM kb_embeddings WHERE kb_sha256 = ?", [kb.sha256]).fetchone()[0]
    assert n == len(kb.rules)


# ------------------------------------------------------------------ cache (no model needed)

def _cached(db: Path, kb) -> "pd.DataFrame":
    return query("SELECT * FROM kb_embeddings WHERE kb_sha256 = ? AND model = ?", db,
                 params=[kb.sha256, retrieval.MODEL_NAME])


def test_embedding_cache_is_keyed_by_kb_hash(kb, tmp_path: Path, monkeypatch):
    calls = []

    def fake_encode(k):
        calls.append(k.sha256)
        rng = np.random.default_rng(len(calls))
        v = rng.normal(size=(len(k.rules), 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    monkeypatch.setattr(retrieval, "_encode_kb", fake_encode)
    db = tmp_path / "w.duckdb"
    first = retrieval.kb_index(kb, _cached(db, kb))
    write({"kb_embeddings": retrieval.embedding_frame(kb, first)}, db)
    second = retrieval.kb_index(kb, _cached(db, kb))
    rows = query("SELECT count(*) AS n, count(DISTINCT rule_id) AS ids, min(dim) AS dim FROM kb_embeddings "
                 "WHERE kb_sha256 = ?", db, params=[kb.sha256]).iloc[0].tolist()
    assert (first.from_cache, second.from_cache) == (False, True)
    assert calls == [kb.sha256]  # the second call read the rows and did not re-embed
    assert rows == [len(kb.rules), len(kb.rules), 384]
    assert second.rule_ids == first.rule_ids == [r.id for r in kb.rules]
    np.testing.assert_allclose(second.vectors, first.vectors, atol=1e-6)

    # a new KB version (different content hash) is embedded again, next to the old rows
    f = tmp_path / "kb.yaml"
    f.write_text(kb.path.read_text() + "\n# edited\n")
    kb2 = load_kb(f)
    assert kb2.sha256 != kb.sha256
    third = retrieval.kb_index(kb2, _cached(db, kb2))
    assert not third.from_cache and calls == [kb.sha256, kb2.sha256]
    # rows of another KB version are never taken for this one
    assert not retrieval.kb_index(kb2, _cached(db, kb)).from_cache


def test_partial_cache_is_rebuilt(kb, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(retrieval, "_encode_kb",
                        lambda k: np.eye(len(k.rules), 384, dtype=np.float32))
    full = retrieval.embedding_frame(kb, retrieval.kb_index(kb))
    again = retrieval.kb_index(kb, full[full["rule_id"] != kb.rules[0].id])
    assert not again.from_cache and again.rule_ids == [r.id for r in kb.rules]
    assert retrieval.kb_index(kb, pd.concat([full, full])).from_cache  # duplicate rows are harmless
