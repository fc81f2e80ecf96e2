"""compare_runs is pure and the HTML report is self-contained: charts, cited rules, diff, footer tuple."""
from __future__ import annotations

import base64
import re

import pytest

from goblin_assets.audit.report import compare_runs, render_html, render_markdown, write_html, write_report
from goblin_assets.contracts import (
    AppliedRule, BenchmarkResult, Citation, ConfigDict, Patch, RunMetrics, RunProvenance, WasteBucket,
)

DIFF = """--- a/train.py
+++ b/train.py
@@ -1,2 +1,2 @@
-x = tokenizer(t, padding="max_length")
+x = tokenizer(t, padding=False)
"""


def _run(useful: float, pad: float, tps: float, label: str = "") -> RunMetrics:
    wb = {"useful": WasteBucket(seconds=useful, status="measured"),
          "data_wait": WasteBucket(seconds=0.01, status="measured"),
          "host_gap": WasteBucket(seconds=0.02, status="measured"),
          "comm_excess": WasteBucket(seconds=0.0, status="measured"),
          "precision_path": WasteBucket(status="not_observable"),
          "kernel_shape": WasteBucket(status="not_observable")}
    return RunMetrics(workload="minilm_lora_cls", unit="tokens", steps=5, step_time_s=useful + 0.03,
                      step_times_s=[useful + 0.03] * 5, tokens_per_sec=tps, padding_share=pad, samples_per_step=8,
                      waste_budget=wb, attention_kernel_loaded=False, warnings=["cpu run: memory is host RSS"],
                      provenance=RunProvenance(kind="measured", device="cpu", torch_version="2.13.0+cpu",
                                               host="h", cpu_count=2, profiler="torch.profiler"))


def _bench(label: str, values: list[float], m: RunMetrics) -> BenchmarkResult:
    return BenchmarkResult(label=label, metrics=m, throughputs=values, median=sorted(values)[len(values) // 2],
                           spread=max(values) - min(values), cache_key="k" * 64)


@pytest.fixture
def report():
    before, after = _run(1.0, 0.5, 500.0), _run(1.0, 0.03, 500.0)
    bench = {"baseline": _bench("baseline", [240.0, 250.0, 260.0], before),
             "patched": _bench("patched", [470.0, 480.0, 500.0], after)}
    rule = AppliedRule(rule_id="data.dynamic_padding", category="data", targets_bucket="useful",
                       citation=Citation(title="Hugging Face Transformers, Trainer", section="group_by_length",
                                         url="https://huggingface.co/docs/transformers/main_classes/trainer"),
                       rationale="Pad each batch to its longest <sequence>.", predicted_recovery=0.47,
                       changes={"padding": {"from": "max_length", "to": "dynamic"}})
    patch = Patch(new_config={}, diff=DIFF, target_file="/w/train.py", applied=[rule],
                  dropped=["attention.flash_attn_missing_use_sdpa: conflicts with X on attention_impl"],
                  consistency_notes=["a and b both target `useful`: combined as 1 - (1 - 0.5)(1 - 0.3)"],
                  expected_speedup_low=1.3, expected_speedup_high=1.9, confidence=0.54, evidence_coverage=0.67,
                  rule_consistency=0.81)
    cfg = ConfigDict(batch_size=8, seq_len=64, padding="max_length")
    return compare_runs(before, after, bench, patch, cfg, model="MiniLM + LoRA")


def test_compare_runs_is_pure_and_uses_real_tokens(report):
    assert report.measured_speedup == pytest.approx(480.0 / 250.0)
    assert report.throughput_unit == "real tokens/s"
    assert (report.predicted_low, report.predicted_high, report.confidence) == (1.3, 1.9, 0.54)
    useful = next(b for b in report.buckets if b.bucket == "useful")
    assert useful.before_status == "measured" and useful.before_s == 1.0
    rows = {r.metric: r for r in report.metrics}
    assert rows["padding share"].before == 0.5 and rows["padding share"].after == 0.03
    # real tokens/s of the profiled runs: tokens/s x (1 - padding share)
    assert rows["real tokens/s (profiled steps)"].before == pytest.approx(250.0)
    assert rows["real tokens/s (profiled steps)"].after == pytest.approx(485.0)


def test_html_is_self_contained_with_charts_rules_diff_and_footer(report, tmp_path):
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # two embedded PNG charts, nothing fetched from elsewhere
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 2
    for img in images:
        assert base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(img) > 5000
    assert not re.search(r'(src|href)="(?!data:|https?://huggingface)[^"]+"', page)
    assert "<script" not in page
    # the rule with its citation, the dropped rule, how overlaps were combined
    assert "data.dynamic_padding" in page and 'href="https://huggingface.co/docs/transformers' in page
    assert "conflicts with X" in page and "both target" in page
    # text is escaped
    assert "&lt;sequence&gt;" in page and "<sequence>" not in page
    # the diff, line by line
    assert '<span class="del">-x = tokenizer(t, padding=&quot;max_length&quot;)</span>' in page
    assert '<span class="add">+x = tokenizer(t, padding=False)</span>' in page
    # the footer tuple
    footer = page[page.index("<footer>"):]
    for needle in ("minilm_lora_cls", "MiniLM + LoRA", "cpu", "none (CPU)", "2.13.0+cpu", "batch_size=8",
                   "seq_len=64"):
        assert needle in footer, needle
    out = write_html(report, tmp_path / "sub" / "r.html")
    assert out.read_text().count("data:image/png;base64,") == 2 and out.stat().st_size > 10_000


def test_write_report_writes_markdown_png_and_html(report, tmp_path):
    md = write_report(report, tmp_path)
    assert md.name == "report.md"
    assert (tmp_path / "report.png").stat().st_size > 5000
    assert (tmp_path / "report.html").read_text().count("data:image/png;base64,") == 2
    text = md.read_text()
    assert "Measured speedup: 1.92x" in text and "real tokens/s" in text and "```diff" in text
    assert "How the rules were combined" in text
    assert render_markdown(report).endswith("Generated " + report.created_at + ".\n")


def test_goblin_audit_accepts_html_option():
    from goblin_assets.cli import build_parser, cmd_audit

    args = build_parser().parse_args(["audit", "workloads/digits_mlp", "--html", "out/report.html", "--json"])
    assert args.html == "out/report.html" and args.json and args.fn is cmd_audit
