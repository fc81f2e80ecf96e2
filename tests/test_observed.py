"""The config as it ran (issue 27): the harness observes the program's settings; observed values win.

Each observed value is checked against what the program really used, read back
from the run (its own objects, written by the override workload's script; the
harness's step counts; the trainer's own arguments), never against the parser.
"""
from __future__ import annotations

import json

import pytest

from goblin_assets.audit.session import AuditSession
from goblin_assets.config.observed import effective_config, observed_values
from goblin_assets.config.parse import config_to_json, parse_config
from goblin_assets.contracts import CONFIG_FIELDS
from goblin_assets.errors import PatchError
from goblin_assets.measure.profile import profile_run
from goblin_assets.patch.propose import edit_source
from goblin_assets.report.compare import config_markdown
from goblin_assets.runners.local import LocalRunner
from goblin_assets.runners.workload import load_workload
from goblin_assets.warehouse import frames as F
from goblin_assets.warehouse.tables import schema
from tests.conftest import REPO, WORKLOADS

OVERRIDE = REPO / "tests" / "data" / "override_workload"


@pytest.fixture(scope="module")
def override_run(tmp_path_factory):
    """One real run of the override workload (flags over its config.yaml), with the script's own truth file."""
    m, truth = truth_run(OVERRIDE, tmp_path_factory.mktemp("observed"), steps=2, warmup=1)
    return load_workload(OVERRIDE), m, truth


def observed_equals_truth(m, truth: dict) -> None:
    """Every ConfigDict field of run ``m`` is observed and equals what the program wrote it used (``truth``: the
    ``OBSERVE_TRUTH`` file, written from the program's own objects; the optimizer by its class name); shared with
    tests/test_trace_scale_ranks.py, which asserts it on its run of the sleepy workload."""
    obs = observed_values(m.observed)
    assert set(obs) == set(CONFIG_FIELDS) == set(truth)
    got = {f: v for f, (v, _) in obs.items()}
    truth = {**truth, "optimizer": {"AdamW": "adamw_torch", "SGD": "sgd"}[truth["optimizer"]]}
    assert got == truth, {f: (got[f], truth[f]) for f in truth if got[f] != truth[f]}
    assert all(p.kind == "observed" for _, p in obs.values())


def truth_run(workload, home, **kw):
    """One short profiled run of ``workload`` with ``OBSERVE_TRUTH`` set: (RunMetrics, the program's truth file)."""
    truth = home / "truth.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOBLIN_HOME", str(home))
        m = profile_run(load_workload(workload), LocalRunner(timeout_s=300), env={"OBSERVE_TRUTH": str(truth)}, **kw)
    assert m.ok, m.failure
    return m, json.loads(truth.read_text())


def test_every_field_observed_equals_what_the_program_used(override_run):
    _, m, truth = override_run
    observed_equals_truth(m, truth)


@pytest.mark.slow
def test_docstring_lm_every_field_observed_equals_what_it_used(tmp_path):
    """tests/data/docstring_lm_oom without its memory cap, one warm-up and one profiled step (the cheapest run
    that takes an optimizer step): every field equals what the program wrote it used."""
    m, truth = truth_run(REPO / "tests" / "data" / "docstring_lm_oom", tmp_path, steps=1, warmup=1)
    observed_equals_truth(m, truth)


def test_flags_over_the_config_file_are_reported_with_both_values(override_run):
    wl, m, _ = override_run
    cfg = effective_config(parse_config(wl.config_file), m.observed, args=wl.args, config_is_entry=False)
    found = {d.field: d for d in cfg.disagreements}
    assert set(found) == {"batch_size", "grad_accum_steps", "precision"}
    assert (found["batch_size"].file_value, found["batch_size"].run_value) == (16, 8)
    assert (found["grad_accum_steps"].file_value, found["grad_accum_steps"].run_value) == (4, 2)
    assert (found["precision"].file_value, found["precision"].run_value) == ("bf16", "fp32")
    for d in found.values():
        assert "config.yaml:" in d.file_where and "workload's arguments" in d.cause and not d.patchable
    assert cfg.batch_size == 8 and cfg.parsed["batch_size"] == 16
    assert cfg.provenance["batch_size"].kind == "observed" and cfg.parsed_provenance["batch_size"].kind == "literal"
    md = "\n".join(config_markdown(cfg))
    assert "3 of 15 observed fields differ" in md and "`'bf16'`" in md and "`'fp32'`" in md
    # the session reads the same: rules and the waste model see the run's values
    s = AuditSession.open(wl, profile_run=m, training_config=parse_config(wl.config_file))
    assert s.effective_config().values() == cfg.values()
    frame = F.observed_frame(s.effective_config(), "a1", wl.name, "a1-profile")
    schema("observed_settings").validate(frame)
    assert sorted(frame.loc[~frame["agrees"], "field"]) == ["batch_size", "grad_accum_steps", "precision"]
    # set by the workload's arguments: no statement of the program, nothing a patch of the file could reach
    differ = frame.loc[~frame["agrees"]]
    assert differ["set_at"].isna().all() and (differ["patchable"] == False).all()  # noqa: E712
    assert frame.loc[frame["agrees"], "patchable"].isna().all()


def test_patch_refuses_a_line_the_run_does_not_read(override_run):
    """digits_mlp's train.py states batch 64; a run that used another batch size makes that line not decide it."""
    _, m, _ = override_run
    src = WORKLOADS / "digits_mlp" / "train.py"
    cfg = effective_config(parse_config(src), m.observed)
    assert {d.field for d in cfg.disagreements} >= {"batch_size", "lr", "optimizer"}
    with pytest.raises(PatchError, match="parser cannot see"):
        edit_source(cfg, {"batch_size": 32}, src, packages={})
    edited = edit_source(cfg, {"dataloader_workers": 2}, src, packages={})   # both say 0: the file's line decides
    assert "default=2" in edited


def test_parse_json_keeps_its_shape():
    cfg = parse_config(OVERRIDE / "config.yaml")
    doc = config_to_json(cfg)
    assert set(doc) == {*CONFIG_FIELDS, "source_file", "source_format", "format", "format_confidence", "format_reason",
                        "provenance", "warnings"}
    assert "no key is a signature" in doc["format_reason"]


def test_digits_every_field_observed(digits_profile):
    """The shipped raw loop: every field observed; batch, accumulation and threads equal the harness's counts."""
    obs = observed_values(digits_profile.observed)
    assert set(obs) == set(CONFIG_FIELDS)
    rec = digits_profile.observed
    assert obs["batch_size"][0] == digits_profile.samples_per_step == 64
    assert obs["grad_accum_steps"][0] == rec["batches_per_step"][-1] == 1
    assert (obs["optimizer"][0], obs["lr"][0], obs["precision"][0]) == ("sgd", 0.05, "fp32")
    assert obs["lora_rank"][0] is None and "no peft adapter" in obs["lora_rank"][1].detail


@pytest.mark.slow
def test_digits_every_field_observed_equals_what_its_loop_used(tmp_path):
    """The shipped digits_mlp, copied with one line added before ``optimizer.step()`` that writes what the loop
    uses from its own objects (tests/data/observe_truth.py; the shipped file carries no test hook): every field
    the harness observed in the same run equals it."""
    import shutil

    copy = tmp_path / "digits_mlp"
    shutil.copytree(WORKLOADS / "digits_mlp", copy, ignore=shutil.ignore_patterns("__pycache__"))
    train = copy / "train.py"
    step = "            optimizer.step()\n"
    text = train.read_text()
    assert text.count(step) == 1, "digits_mlp's loop changed: put the truth line before its optimizer step"
    hook = (f"            __import__('sys').path.insert(0, {str(REPO / 'tests' / 'data')!r}); "
            "__import__('observe_truth').write(model, loader, optimizer, x, accum=1)\n")
    train.write_text(text.replace(step, hook + step))
    m, truth = truth_run(copy, tmp_path / "home", steps=2, warmup=1)
    observed_equals_truth(m, truth)
    assert truth["batch_size"] == 64 and truth["optimizer"] == "SGD"


@pytest.mark.slow
@pytest.mark.parametrize("name,precision", [("tiny_workload", "fp32"), ("fp16_overflow_workload", "fp16"),
                                            ("half_workload", "fp16")])
def test_test_workloads_every_field_observed(tmp_path, name, precision):
    """The runnable test workloads (MiniLM: tests/test_minilm_audit.py; digits_mlp, docstring_lm_oom: above;
    sleepy_workload, invariant_workload: their own tests' runs): every field
    observed, equal to what the loop wrote it used; batch and accumulation also equal the harness's own counts,
    precision the dtype the stepped parameters really had (``model.half()``: float16, no autocast)."""
    m, truth = truth_run(REPO / "tests" / "data" / name, tmp_path, steps=2, warmup=1)
    observed_equals_truth(m, truth)
    obs = {f: v for f, (v, _) in observed_values(m.observed).items()}
    assert obs["batch_size"] == m.samples_per_step / m.observed["batches_per_step"][-1]
    assert obs["grad_accum_steps"] == m.observed["backward_per_step"][-1] == 1
    dtype = {"fp32": "float32", "fp16": "float16"}[precision]
    assert obs["precision"] == precision and set(m.observed["param_dtypes"]) == {dtype}
    assert obs["optimizer"] == "sgd" and not m.observed["autocast"]


@pytest.mark.slow
def test_a_lightning_trainers_own_values_are_observed(tmp_path):
    """tests/data/lightning_workload: Lightning's Trainer, not the loop, decides accumulation (2) and precision
    (bf16-mixed: autocast on the CPU), and the optimizer steps inside Lightning's closure.  Every field is
    observed and equals what the run used; the Trainer object's own values are recorded; the parser agrees with
    the run wherever it states a value (the learning rate, ``self.lr``, it cannot know: the run settles it)."""
    workload = REPO / "tests" / "data" / "lightning_workload"
    m, truth = truth_run(workload, tmp_path, steps=2, warmup=1)
    observed_equals_truth(m, truth)
    lt = m.observed["lightning_trainer"]
    assert (lt["precision"], lt["accumulate_grad_batches"], lt["num_devices"]) == ("bf16-mixed", 2, 1)
    assert lt["strategy"] == "lightning.pytorch.strategies.single_device.SingleDeviceStrategy"
    assert m.observed["backward_per_step"][-1] == lt["accumulate_grad_batches"]
    assert m.samples_per_step == truth["batch_size"] * lt["accumulate_grad_batches"]
    parsed = parse_config(workload / "train.py")
    assert parsed.provenance["lr"].kind == "unset"
    cfg = effective_config(parsed, m.observed, source=workload / "train.py")
    assert not cfg.disagreements, cfg.disagreements
    assert cfg.values()["lr"] == truth["lr"] and cfg.provenance["lr"].kind == "observed"


def observed_equals_trainer(m) -> None:
    """A Trainer + LoRA run's observed fields equal the Trainer's and the adapter's own objects (read in the run);
    shared with tests/test_minilm_audit.py, which asserts it on its audit's profiled run."""
    obs = {f: v for f, (v, _) in observed_values(m.observed).items()}
    assert set(obs) == set(CONFIG_FIELDS)
    ta, ad = m.observed["training_arguments"], m.observed["adapter"]
    assert obs["batch_size"] == ta["per_device_train_batch_size"] == m.samples_per_step
    assert obs["grad_accum_steps"] == ta["gradient_accumulation_steps"] == 1
    assert obs["lr"] == ta["learning_rate"] and obs["warmup_steps"] == ta["warmup_steps"]
    assert obs["lora_rank"] == ad["r"] and ad["target_modules"] == ["query", "value"]
    assert obs["seq_len"] == pytest.approx(m.tokens_per_sec / m.samples_per_sec)   # tokens per sample, counted
    assert (obs["attention_impl"], obs["padding"], obs["precision"]) == ("eager", "max_length", "fp32")
    # the rest of the fields, each against the Trainer's, the model's or torch's own value read in the run
    assert obs["precision"] == ("bf16" if ta["bf16"] else "fp16" if ta["fp16"] else "fp32")
    assert obs["optimizer"] == ta["optim"] and obs["dataloader_workers"] == ta["dataloader_num_workers"]
    assert obs["gradient_checkpointing"] == ta["gradient_checkpointing"] == m.observed["model"]["gradient_checkpointing"]
    assert obs["group_by_length"] == (bool(ta.get("group_by_length"))
                                      or ta.get("train_sampling_strategy") == "group_by_length")
    assert obs["model_name"] == m.observed["model"]["name_or_path"]      # the model object's own name_or_path
    assert obs["intra_op_threads"] == m.observed["threads"]              # torch.get_num_threads() in the run


SETS_AT_RUN_TIME = '''import argparse
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
cli = p.parse_args()
cli.batch_size = 8
torch.set_num_threads(4)
model = AutoModelForSequenceClassification.from_pretrained("prajjwal1/bert-tiny")
args = TrainingArguments("out", per_device_train_batch_size=cli.batch_size, gradient_checkpointing=False,
                         learning_rate=0.001)
model.gradient_checkpointing_enable()
torch.set_num_threads(1)
'''


def _record(batch: int, threads: int, checkpointing: bool, lr: float) -> dict:
    """An observation as the harness writes it (runners/observe.py), for the fields these tests read."""
    return {"loaders": [{"step": 1, "cls": "torch.utils.data.DataLoader", "batch_size": batch, "num_workers": 0,
                         "where": "train.py:12"}],
            "model": {"cls": "BertForSequenceClassification", "name_or_path": "prajjwal1/bert-tiny",
                      "gradient_checkpointing": checkpointing},
            "optimizers": [{"cls": "AdamW", "module": "torch.optim", "groups": [{"lr": lr}]}],
            "threads": threads}


def test_patchable_says_whether_the_writer_can_edit_the_place_that_wins(tmp_path):
    """A disagreement is patchable only when a literal statement of the parsed script sets the run's value
    (``config.overrides.setting_call``); a call that pulls a lever, a statement in another file than the one
    the patch writes, or a value no statement states is reported as set where the patch cannot write."""
    src = tmp_path / "train.py"
    src.write_text(SETS_AT_RUN_TIME)
    parsed = parse_config(src)
    assert (parsed.batch_size, parsed.intra_op_threads, parsed.gradient_checkpointing) == (64, 4, False)
    eff = effective_config(parsed, _record(8, 1, True, 0.01), source=src)
    found = {d.field: d for d in eff.disagreements}
    assert set(found) == {"batch_size", "intra_op_threads", "gradient_checkpointing", "lr"}
    # a literal assignment and a literal call argument of the parsed script: the writer edits them
    b, t = found["batch_size"], found["intra_op_threads"]
    assert b.patchable and (b.set_at.line, b.set_at.detail) == (9, "cli.batch_size = 8") and "line 9" in b.cause
    assert t.patchable and (t.set_at.line, t.set_at.detail) == (15, "torch.set_num_threads(1)")
    # a call that pulls a lever holds no value to rewrite
    g = found["gradient_checkpointing"]
    assert not g.patchable and g.set_at.line == 14 and g.set_at.span is None and "a call" in g.cause
    # no statement states the run's lr: the place that wins is one the parser cannot see
    lr = found["lr"]
    assert not lr.patchable and lr.set_at is None and "parser cannot see" in lr.cause
    # the patch writes into the place that wins as well as the parsed line, and reads back as written
    edited = edit_source(eff, {"batch_size": 16, "intra_op_threads": 2}, src, packages={})
    assert "default=16" in edited and "cli.batch_size = 16" in edited
    assert edited.count("torch.set_num_threads(2)") == 2 and "set_num_threads(1)" not in edited
    with pytest.raises(PatchError, match="line 14 of train.py sets it at run time .* a call"):
        edit_source(eff, {"gradient_checkpointing": False}, src, packages={})
    with pytest.raises(PatchError, match="parser cannot see"):
        edit_source(eff, {"lr": 0.02}, src, packages={})
    # the warehouse row says so too: the statement that sets the run's value, and whether the patch reaches it
    rows = F.observed_frame(eff, "a1", "w", "a1-profile").set_index("field")
    assert rows.loc["batch_size", "set_at"] == "train.py:9: cli.batch_size = 8" and rows.loc["batch_size", "patchable"]
    assert rows.loc["gradient_checkpointing", "set_at"].startswith("train.py:14: ")
    assert rows.loc["gradient_checkpointing", "patchable"] == False  # noqa: E712
    assert rows.loc["lr", "set_at"] is None and rows.loc["lr", "patchable"] == False  # noqa: E712
    # the report says so, per field
    md = "\n".join(config_markdown(eff))
    assert md.count("A patch of this field edits the line that sets the run's value") == 2
    assert md.count("No patch is written for this field") == 2
    # the same statement in a program that is not the parsed file: the patch writes only the parsed file
    other = effective_config(parsed, _record(8, 4, False, 0.001), source=src, config_is_entry=False)
    (d,) = other.disagreements
    assert d.field == "batch_size" and d.set_at.line == 9 and not d.patchable and "writes only" in d.cause
    # without the program (a caller that does not say what ran), nothing is patchable
    assert not any(d.patchable for d in effective_config(parsed, _record(8, 1, True, 0.01)).disagreements)


@pytest.mark.slow
def test_a_loop_without_a_dataloader_is_observed_from_the_models_own_inputs(tmp_path):
    """tests/data/broken/compiled_branchy makes its batches in the loop (``torch.randint(0, 64, (8, seq))``, no
    DataLoader) and calls a torch.compile'd model: every field is observed, the batch from the leading dimension
    of the compiled wrapper's input (called eagerly), workers 0 (the main process makes the batches).  It is
    also a profiled run of a compiled model (its tensor census once failed on dynamo's dead weak proxies)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOBLIN_HOME", str(tmp_path))
        m = profile_run(load_workload(REPO / "tests" / "data" / "broken" / "compiled_branchy"),
                        LocalRunner(timeout_s=300), steps=2, warmup=1)
    assert m.ok, m.failure
    obs = observed_values(m.observed)
    assert set(obs) == set(CONFIG_FIELDS)
    got = {f: v for f, (v, _) in obs.items()}
    # the loop's batches are 8 sequences of 16 tokens until step --switch (4); 3 steps ran
    assert got["batch_size"] == 8 and got["seq_len"] == 16 and got["dataloader_workers"] == 0
    assert [r["shape"] for r in m.observed["inputs"]] == [[8, 16]] * 3
    assert got["optimizer"] == "adamw_torch" and got["lr"] == 1e-3 and got["grad_accum_steps"] == 1
    assert got["padding"] is None and got["group_by_length"] is False and got["precision"] == "fp32"
    assert "no DataLoader was iterated" in obs["batch_size"][1].detail


def test_optimizer_hyperparameters_of_any_shape_are_recorded_as_numbers():
    """Adafactor's ``eps`` is a pair holding None and torch takes a tensor ``lr``: both are recorded as numbers the
    result schema holds (both once made a run's results unreadable, so the OOM fix to Adafactor 'failed')."""
    import torch

    from goblin_assets.runners.observe import Observer
    from goblin_assets.runners.result import ObservedOptimizer

    p = [torch.nn.Parameter(torch.zeros(2, 2))]
    obs = Observer({})
    ada = ObservedOptimizer.model_validate(obs._optimizer_record(torch.optim.Adafactor(p, lr=1e-3)))
    assert ada.cls == "Adafactor" and ada.groups[0].eps == [None, 1e-3] and ada.groups[0].betas is None
    adam = ObservedOptimizer.model_validate(obs._optimizer_record(torch.optim.AdamW(p, lr=torch.tensor(2e-3))))
    assert adam.groups[0].lr == pytest.approx(2e-3) and adam.groups[0].betas == [0.9, 0.999]
    assert adam.groups[0].eps == 1e-8 and adam.groups[0].weight_decay == 0.01
