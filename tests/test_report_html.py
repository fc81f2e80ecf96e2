"""compare_runs is pure and the HTML report is self-contained: charts, cited rules, diff, footer tuple.

Every measured speedup has an interval, and a patch that changes nothing reads "no significant change";
each metric is listed once; the profiled speedup is reconciled with the benchmarked one.
"""
from __future__ import annotations

import base64
import math
import re

import pytest

from goblin_assets.contracts import (
    AppliedRule,
    BenchmarkResult,
    Citation,
    ConfigDict,
    Patch,
    RunMetrics,
    RunProvenance,
    WasteBucket,
)
from goblin_assets.report.compare import compare_runs
from goblin_assets.report.html import render_html, write_html, write_report
from goblin_assets.report.markdown import render_markdown

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


def _bench(label: str, values: list[float], m: RunMetrics, pair_id: str | None = "p1") -> BenchmarkResult:
    return BenchmarkResult(label=label, metrics=m, throughputs=values, median=sorted(values)[len(values) // 2],
                           spread=max(values) - min(values), cache_key="k" * 64, pair_id=pair_id,
                           stop_reason="decided after 3 pairs: the 95% interval excludes 1.0")


def _patch() -> Patch:
    rule = AppliedRule(rule_id="data.dynamic_padding", category="data", targets_bucket="useful",
                       citation=Citation(title="Hugging Face Transformers, Trainer", section="group_by_length",
                                         url="https://huggingface.co/docs/transformers/main_classes/trainer"),
                       rationale="Pad each batch to its longest <sequence>.", predicted_recovery=0.47,
                       changes={"padding": {"from": "max_length", "to": "dynamic"}})
    return Patch(new_config={}, diff=DIFF, target_file="/w/train.py", applied=[rule],
                 dropped=["attention.flash_attn_missing_use_sdpa: conflicts with X on attention_impl"],
                 consistency_notes=["a and b both target `useful`: combined as 1 - (1 - 0.5)(1 - 0.3)"],
                 expected_speedup_low=1.3, expected_speedup_high=1.9, confidence=0.54, evidence_coverage=0.67,
                 rule_consistency=0.81)


CFG = ConfigDict(batch_size=8, seq_len=64, padding="max_length")


@pytest.fixture
def report():
    before, after = _run(1.0, 0.5, 500.0), _run(1.0, 0.03, 500.0)
    bench = {"baseline": _bench("baseline", [240.0, 250.0, 260.0], before),
             "patched": _bench("patched", [470.0, 480.0, 500.0], after)}
    return compare_runs(before, after, bench, _patch(), CFG, model="MiniLM + LoRA")


def test_compare_runs_is_pure_and_uses_real_tokens(report):
    # the geometric mean of the paired ratios, with its interval
    ratios = [470.0 / 240.0, 480.0 / 250.0, 500.0 / 260.0]
    assert report.measured_speedup == pytest.approx(math.exp(sum(map(math.log, ratios)) / 3))
    iv = report.measured_interval
    assert iv.paired and iv.pairs == 3 and iv.level == 0.95 and iv.verdict == "faster"
    assert 1.0 < iv.low < report.measured_speedup < iv.high
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
    assert "Measured speedup: faster: 1.93x (95% interval" in text and "real tokens/s" in text and "```diff" in text
    assert "How the rules were combined" in text
    assert render_markdown(report).endswith("Generated " + report.created_at + ".\n")


def test_goblin_audit_accepts_html_option():
    from goblin_assets.cli import build_parser, cmd_audit

    args = build_parser().parse_args(["audit", "workloads/digits_mlp", "--html", "out/report.html", "--json"])
    assert args.html == "out/report.html" and args.json and args.fn is cmd_audit


def _noop(values_b: list[float], values_p: list[float], pair_id: str | None = "p1"):
    m = _run(1.0, 0.0, 500.0)
    bench = {"baseline": _bench("baseline", values_b, m, pair_id), "patched": _bench("patched", values_p, m, pair_id)}
    return compare_runs(m, m, bench, _patch(), CFG, model="MiniLM + LoRA")


def test_a_noop_patch_reads_no_significant_change_everywhere(tmp_path):
    """Done when (issue 15): the report of a no-op patch says "no significant change", never "1.04x faster"."""
    rep = _noop([250.0, 240.0, 262.0], [262.0, 248.0, 255.0])   # ratios 1.05, 1.03, 0.97: noise only
    assert rep.measured_interval.verdict == "no significant change"
    assert rep.measured_interval.low < 1.0 < rep.measured_interval.high
    md, page = render_markdown(rep), render_html(rep)
    for text in (md, page):
        assert "Measured speedup: no significant change: 1.02x (95% interval" in text
        assert not re.search(r"\d\.\d\dx faster", text)
    assert "Throughput: no significant change" not in md  # the chart title is in the PNG, not the text


def test_unpaired_arms_get_welch_and_a_single_pair_says_no_interval():
    rep = _noop([250.0, 240.0, 262.0], [500.0, 490.0], pair_id=None)
    assert not rep.measured_interval.paired and "Welch" in rep.measured_interval.method
    assert rep.measured_interval.verdict == "faster"
    one = _noop([250.0], [500.0])
    assert one.measured_interval.verdict == "no interval" and one.measured_interval.low is None
    assert "no interval" in render_markdown(one)


@pytest.mark.parametrize("unit", ["samples", "tokens"])
def test_side_by_side_lists_each_metric_once(unit):
    m = _run(1.0, 0.2, 500.0).model_copy(update={"unit": unit, "samples_per_sec": 8.0})
    rows = [r.metric for r in compare_runs(m, m, {"baseline": _bench("baseline", [8.0, 8.1], m),
                                                  "patched": _bench("patched", [8.2, 8.0], m)},
                                           _patch(), CFG).metrics]
    assert len(rows) == len(set(rows)), rows
    values = [(r.metric, r.before) for r in compare_runs(m, m, {"baseline": _bench("baseline", [8.0, 8.1], m),
                                                                "patched": _bench("patched", [8.2, 8.0], m)},
                                                         _patch(), CFG).metrics]
    throughput_rows = [k for k, v in values if k.endswith("/s (profiled steps)") and v == m.throughput]
    assert len(throughput_rows) == 1, values


def test_headroom_batch_row_says_memory_is_not_the_limit():
    m = _run(1.0, 0.0, 500.0)
    m.not_observable["headroom_batch"] = "memory is not the limit: the free memory would hold about 12,000,000 ..."
    rep = compare_runs(m, m, {"baseline": _bench("baseline", [8.0, 8.1], m), "patched": _bench("patched", [8.2, 8.0], m)},
                       _patch(), CFG)
    row = next(r for r in rep.metrics if r.metric.startswith("headroom batch"))
    assert row.before == "memory is not the limit"
    assert any(w.startswith("headroom batch: memory is not the limit") for w in rep.warnings)
    assert "12,000,000" in render_markdown(rep) and "| headroom batch (estimated) | memory is not the limit |" in \
        render_markdown(rep)


def test_profiled_and_benchmarked_speedups_are_reconciled():
    """digits_mlp once profiled 5x while its benchmark measured 1.55x: the report says which arm and why."""
    before = _run(0.02, 0.0, 0.0).model_copy(update={"unit": "samples", "samples_per_sec": 3200.0,
                                                     "tokens_per_sec": None, "real_tokens_per_sec": None})
    after = before.model_copy(update={"samples_per_sec": 16000.0})          # profiled: 5x
    bench = {"baseline": _bench("baseline", [3100.0, 3200.0, 3300.0], before),
             "patched": _bench("patched", [4900.0, 4950.0, 5100.0], after)}  # benchmarked: ~1.55x
    rep = compare_runs(before, after, bench, _patch(), CFG)
    assert rep.profiled_speedup == pytest.approx(5.0)
    text = " ".join(rep.reconciliation)
    assert "imply 5.00x" in text and "disagree" in text and "trust the benchmark" in text
    assert "patched run went 3.23x faster than its timed repeats" in text
    assert "prefetch queue" in text and "did not report" in text       # no prefetch_warmup_steps from this harness
    assert "original run" not in text                                     # the original agrees with its benchmark
    drained = compare_runs(before.model_copy(update={"prefetch_warmup_steps": 0}),
                           after.model_copy(update={"prefetch_warmup_steps": 2}), bench, _patch(), CFG)
    assert "skipped 2 step(s) after the warm-up" in " ".join(drained.reconciliation)
    # profiler overhead: the profiled patched run slower than timed
    slow = compare_runs(before, before.model_copy(update={"samples_per_sec": 2500.0}), bench, _patch(), CFG)
    assert "profiler overhead" in " ".join(slow.reconciliation)
    # agreement is said too
    ok = compare_runs(before, before.model_copy(update={"samples_per_sec": 5000.0}), bench, _patch(), CFG)
    assert "They agree" in ok.reconciliation[0]
    assert "## Profiled vs benchmarked" in render_markdown(rep) and "Profiled vs benchmarked" in render_html(rep)


def test_calibrated_prediction_says_how_many_audits_it_came_from():
    from goblin_assets.measure.calibration import calibrate

    history = [{"audit_id": f"a{i}", "workload": "w", "rules": "data.dynamic_padding", "measured_speedup": 1.2 + i / 100,
                "predicted_speedup_low": 1.3, "predicted_speedup_high": 1.9} for i in range(4)]
    m = _run(1.0, 0.0, 500.0)
    bench = {"baseline": _bench("baseline", [250.0, 240.0], m), "patched": _bench("patched", [300.0, 290.0], m)}
    rep = compare_runs(m, m, bench, _patch(), CFG, calibration=calibrate(_patch(), history))
    assert rep.predicted_high < 1.9 and rep.calibration.model_high == 1.9 and rep.calibration.audits == 4
    md = render_markdown(rep)
    assert "scaled by the record of 4 measured audits" in md and "data.dynamic_padding: 4 audits" in md


def test_html_shows_the_config_as_it_ran():
    """The HTML page carries the markdown report's section on the config as it ran: each disagreement with
    both values and where each came from, and the observed value beside the parsed one for every field."""
    from goblin_assets.contracts import Disagreement, Provenance

    cfg = CFG.model_copy(update={
        "batch_size": 4, "provenance": {"batch_size": Provenance(kind="observed", detail="DataLoader(batch_size=4)"),
                                        "seq_len": Provenance(kind="observed", detail="width of the token field")},
        "parsed": {"batch_size": 8, "seq_len": 64},
        "parsed_provenance": {"batch_size": Provenance(file="train.yaml", line=3, kind="literal"),
                              "seq_len": Provenance(file="train.yaml", line=4, kind="literal")},
        "disagreements": [Disagreement(field="batch_size", file_value=8, file_where="train.yaml:3 (literal)",
                                       run_value=4, run_where="observed: DataLoader(batch_size=4)",
                                       cause="the workload's arguments (--batch-size 4) override it")]})
    before, after = _run(1.0, 0.5, 500.0), _run(1.0, 0.5, 500.0)
    bench = {"baseline": _bench("baseline", [240.0, 250.0], before), "patched": _bench("patched", [240.0, 250.0],
                                                                                         after)}
    rep = compare_runs(before, after, bench, _patch(), cfg)
    page = render_html(rep)
    assert "<h2>The config as it ran (observed)</h2>" in page
    assert "1 of 2 observed fields differ" in page and "train.yaml:3 (literal)" in page
    assert "--batch-size 4" in page and "No patch is written for this field" in page
    assert re.search(r"<td>batch_size</td>\s*<td><code>8</code>.*</td>\s*<td><code>4</code>.*</td>\s*<td>no</td>",
                     page)
    assert re.search(r"<td>seq_len</td>(\s*<td>[^\n]*</td>){2}\s*<td>yes</td>", page)
    assert "## The config as it ran" in render_markdown(rep)
