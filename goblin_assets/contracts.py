"""Data contracts shared by every layer (DESIGN.md, "Data contracts").

Pydantic models only: no Dagster, no torch.  Every stage takes and returns
these types, so the CLI, the Dagster assets and the tests see the same
objects.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

# --------------------------------------------------------------------------- config

#: Fields of the ConfigDict, in display order.  ``intra_op_threads`` extends
#: DESIGN.md's list: it is the main process's ``torch.set_num_threads`` value,
#: needed to size data-loader workers and threads together.  ``padding`` and
#: ``group_by_length`` extend it too: how each batch's sequences are padded
#: (so a padding-waste rule has something in the file to change).
CONFIG_FIELDS: tuple[str, ...] = (
    "model_name",
    "batch_size",
    "grad_accum_steps",
    "seq_len",
    "precision",
    "optimizer",
    "attention_impl",
    "gradient_checkpointing",
    "lora_rank",
    "dataloader_workers",
    "intra_op_threads",
    "lr",
    "warmup_steps",
    "padding",
    "group_by_length",
)

#: ``ConfigDict.padding`` values: how the sequences of one batch are padded.
#: ``max_length``: every sequence padded to a fixed length when tokenised
#: (fixed shapes, pad tokens computed on); ``longest``: padded at
#: tokenisation to the longest sequence of the tokenised group (per batch only
#: when tokenised per batch); ``dynamic``: not padded at tokenisation, a
#: collator pads each batch to its own longest sequence; ``packed``: several
#: sequences share one row (sample packing / padding-free).
PaddingStrategy = Literal["max_length", "longest", "dynamic", "packed"]

ValueKind = Literal["literal", "default", "variable", "env", "inferred", "unset", "observed"]


class Provenance(BaseModel):
    """Where one ConfigDict value came from.

    ``kind`` is ``literal`` (written at the use site), ``default`` (an
    argparse/dataclass/tool default), ``variable`` (resolved through a name or
    arithmetic), ``env`` (``os.environ.get`` default), ``inferred`` (derived
    from code patterns such as ``torch.autocast``), ``unset`` (the value is
    null; ``detail`` says why) or ``observed`` (read from the running program
    by the harness in a live audit, issue 27: ``file``/``line`` are where the
    program set it up, ``key`` the object read, e.g. ``DataLoader.batch_size``;
    a null observed value means the run shows the feature is absent).  ``span`` is ``(lineno, col, end_lineno,
    end_col)`` of the value's source text (1-based lines, 0-based columns) when
    the value is written in the file, so a patch can rewrite exactly it.
    """

    file: str | None = None
    line: int | None = None
    kind: ValueKind = "unset"
    detail: str = ""
    span: tuple[int, int, int, int] | None = None
    key: str | None = None


class Disagreement(BaseModel):
    """A field whose observed value differs from the file's (a finding of the report, issue 27).

    ``file_value`` / ``file_where``: the parsed value and where the parser
    found it (``train.yaml:3 (literal)``); ``run_value`` / ``run_where``: the
    value the program ran with and where the harness read it; ``cause`` what
    sets the winning value, as far as the audit can tell; ``why`` one
    sentence naming both values and the cause.  ``set_at`` is the statement of the program that
    sets the run's value, when the audit found one (an assignment or call in the entry script,
    ``config.overrides.setting_call``); None when the value comes from a place the parser cannot
    see (the workload's arguments, a value computed at run time).  ``patchable`` is True only when
    that statement states the value as a literal in the file the patch writes, so the patch
    writer rewrites it together with the file's line; else a patch of the file's line would
    change nothing, and none is written for this field.
    """

    field: str
    file_value: Any = None
    file_where: str = ""
    run_value: Any = None
    run_where: str = ""
    cause: str = ""
    why: str = ""
    set_at: Provenance | None = None
    patchable: bool = False


class ConfigDict(BaseModel):
    """The training configuration parsed from a user's file.

    Units: ``lr`` is the peak learning rate; ``seq_len`` in tokens;
    ``batch_size`` is per device, in samples.  ``padding`` is one of
    :data:`PaddingStrategy`; ``group_by_length`` says whether batches are
    drawn from samples of similar length (HF ``train_sampling_strategy=
    "group_by_length"``, formerly ``group_by_length=True``).  A value that cannot be
    determined is ``None`` and its provenance (kind ``unset``) gives the
    reason: nothing is guessed.
    """

    model_name: str | None = None
    batch_size: int | None = None
    grad_accum_steps: int | None = None
    seq_len: int | None = None
    precision: Literal["fp16", "bf16", "fp32"] | None = None
    optimizer: str | None = None
    attention_impl: Literal["sdpa", "flash", "eager", "unknown"] | None = None
    gradient_checkpointing: bool | None = None
    lora_rank: int | None = None
    dataloader_workers: int | None = None
    intra_op_threads: int | None = None
    lr: float | None = None
    warmup_steps: int | None = None
    padding: PaddingStrategy | None = None
    group_by_length: bool | None = None
    raw_source: str = ""
    source_file: str = ""
    source_format: str = ""
    #: How sure the parser is of the file's format and tool (0: unknown, no defaults applied; issue 17).
    format_confidence: float | None = None
    #: Why the detector read the file as its tool (the signature key, the share of known keys; issue 27).
    format_reason: str = ""
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    #: Live audits (issue 27): the parsed value and provenance of every field the run's observation replaced,
    #: and each field where the two disagree.  Empty for a config that was only parsed.
    parsed: dict[str, Any] = Field(default_factory=dict)
    parsed_provenance: dict[str, Provenance] = Field(default_factory=dict)
    disagreements: list[Disagreement] = Field(default_factory=list)

    def values(self) -> dict[str, Any]:
        """The ConfigDict fields only (no source, provenance or warnings)."""
        return {f: getattr(self, f) for f in CONFIG_FIELDS}

    def as_parsed(self) -> ConfigDict:
        """The config as the file states it: observed values and provenance replaced by the parsed ones
        (itself when nothing was observed).  The patch edits this view: it writes into the file's lines."""
        if not self.parsed_provenance:
            return self
        return self.model_copy(update={**self.parsed, "provenance": {**self.provenance, **self.parsed_provenance},
                                       "parsed": {}, "parsed_provenance": {}})


# --------------------------------------------------------------------------- metrics

WASTE_BUCKETS: tuple[str, ...] = (
    "useful",
    "data_wait",
    "host_gap",
    "comm_excess",
    "precision_path",
    "kernel_shape",
)

#: Findings the tensor miners write to the ``patterns`` table, readable in detect conditions as
#: ``patterns.<site>.<finding>`` (goblin_assets/opscope/miner.py: the per-site rule table and the
#: cross-step stationarity).
PATTERN_FINDINGS: tuple[str, ...] = (
    "sparse_gemm", "int_quant", "quantize_lut", "delta_compute", "positional", "dense_not_observable",
    "stationary", "drifting", "nonfinite",
)

BucketStatus = Literal["measured", "estimated", "not_observable"]


class WasteBucket(BaseModel):
    """One bucket of the waste budget, in seconds per step."""

    seconds: float = 0.0
    status: BucketStatus = "not_observable"
    note: str = ""


class KernelShare(BaseModel):
    """An op or kernel and its share of profiled time (percent, 0..100)."""

    name: str
    pct_time: float


class RunProvenance(BaseModel):
    """How a RunMetrics came to be: never present replayed or modelled as measured."""

    kind: Literal["measured", "replayed", "modelled"]
    device: str = "cpu"
    arch: str | None = None
    profiler: str | None = None
    source: str = ""
    torch_version: str | None = None
    hip_version: str | None = None
    cuda_version: str | None = None
    host: str | None = None
    cpu_count: int | None = None
    measured_at: str | None = None


class Signal(BaseModel):
    """One of the run's own signals (measure/signals.py): a known message that came, or a derived record.

    ``count``: how many times; ``message``: its first text; ``where``: ``file:line``
    of a warning, ``stderr``, ``loss``, ``optimizer`` or ``parameters``;
    ``step``: the optimizer step (from 1) it first came in, when known.
    """

    id: str
    count: int
    message: str = ""
    where: str = ""
    step: int | None = None
    meaning: str = ""
    source: str = ""


class Invariant(BaseModel):
    """One run-time invariant check of a training step (measure/invariants.py), judged on the run's records.

    ``status``: ``fired`` (the invariant is broken), ``silent`` (it holds) or
    ``not_observable`` (the run cannot show it; ``message`` says why).
    ``value``: the number ``detect`` conditions read as ``invariants.<id>``
    (its unit in ``unit``; 0 when silent; unread when not observable).
    ``where``: the module, tensor, parameter or step the evidence names;
    ``evidence``: what was measured; ``threshold``: the bound and its source;
    ``rules``: the KB rules this finding feeds.
    """

    id: str
    status: Literal["fired", "silent", "not_observable"]
    evidence: dict[str, Any] = Field(default_factory=dict)
    severity: Literal["info", "warning", "error"] = "info"
    rules: list[str] = Field(default_factory=list)
    value: float | None = None
    step: int | None = None
    # the words: the value's unit, what was found, where, and the bound it was held against
    unit: str = ""
    message: str = ""
    where: str = ""
    threshold: str = ""


class RunMetrics(BaseModel):
    """What profile_run and benchmark return (DESIGN.md RunMetrics).

    Units: ``step_time_s`` median seconds per step; throughput per second;
    ``tokens_per_sec`` counts every ``input_ids`` position (pad included),
    ``real_tokens_per_sec`` only the attention mask's ones (filled from
    ``tokens_per_sec`` and ``padding_share`` when not given);
    memory in GB (1e9 bytes); ``util_pct`` and ``mfu_pct`` in percent.
    ``headroom_batch`` is the per-device batch size (samples per micro-batch)
    whose modelled memory peak fills the device: the measured batch plus
    ``memory_headroom_gb`` over the activation memory per sample (estimated,
    linear in the batch), bounded by the dataset when the harness knows its
    size, and null ("memory is not the limit", see ``not_observable``) when
    it would extrapolate too far (measure/profile.py).
    ``prefetch_warmup_steps``: optimizer steps the harness added to the
    warm-up to drain the DataLoader's prefetch queue (None: not reported).
    ``dataset_in_memory``: the first DataLoader's items are slices of
    tensors already in memory (a ``TensorDataset``), so worker processes
    only add cost (None: not reported).
    ``not_observable`` maps a null field's name to the reason it is null.
    ``signals``: the run's own signals (warnings, stderr lines, loss and
    gradient records matched to known messages; None: not recorded, e.g. an
    older recording).
    ``invariants``: the run-time invariant checks (measure/invariants.py; None:
    not recorded, e.g. a benchmark run or an older recording).
    ``cores_busy``: the run's own process kept at least 90 % of the cores busy
    over the profiled steps (measured CPU seconds over wall seconds x cores),
    so more threads or workers would time-share them (None: not measured).
    ``all_step_times_s``: seconds of every optimizer step the harness ran,
    warm-up included (step 1 first; empty when not recorded);
    ``step_outliers``: the steps past 1.5x the median step with what they
    spent their time on (:func:`goblin_assets.measure.step_outliers.outlier_steps`).
    ``nonfinite_step``: the first optimizer step (1-based, warm-up steps
    counted) after which a parameter held NaN or inf, and
    ``nonfinite_params`` those parameters as the harness describes them
    (optimizers hold tensors, not names: place, shape, dtype; empty: none
    was non-finite at the end; measure/evidence.py reads them).
    ``observed``: the settings the program ran with, as the harness recorded
    them (``runners.result.ObservedRecord`` dumped; None: a replay or an
    older recording); :mod:`goblin_assets.config.observed` reads it.
    """

    ok: bool = True
    failure: str | None = None
    stderr_tail: str = ""
    workload: str = ""
    steps: int = 0
    step_time_s: float | None = None
    step_times_s: list[float] = Field(default_factory=list)
    all_step_times_s: list[float] = Field(default_factory=list)
    step_outliers: list[dict] = Field(default_factory=list)
    unit: Literal["samples", "tokens"] = "samples"
    samples_per_sec: float | None = None
    tokens_per_sec: float | None = None
    real_tokens_per_sec: float | None = None
    samples_per_step: float | None = None
    padding_share: float | None = None
    mfu_pct: float | None = None
    mem_peak_gb: float | None = None
    mem_avg_gb: float | None = None
    util_pct: float | None = None
    top_kernels: list[KernelShare] = Field(default_factory=list)
    attention_kernel_loaded: bool | None = None
    waste_budget: dict[str, WasteBucket] = Field(default_factory=dict)
    memory_headroom_gb: float | None = None
    dynamo: dict[str, Any] | None = None  # torch.compile's record of the run (measure/compile_counters.py)
    headroom_batch: int | None = None
    nonfinite_step: int | None = None
    nonfinite_params: list[str] = Field(default_factory=list)
    prefetch_warmup_steps: int | None = None
    dataset_in_memory: bool | None = None
    signals: list[Signal] | None = None
    observed: dict[str, Any] | None = None
    invariants: list[Invariant] | None = None
    cores_busy: bool | None = None
    warnings: list[str] = Field(default_factory=list)
    not_observable: dict[str, str] = Field(default_factory=dict)
    provenance: RunProvenance = Field(default_factory=lambda: RunProvenance(kind="measured"))
    trace_path: str | None = None
    run_dir: str | None = None

    @model_validator(mode="after")
    def _real_tokens(self) -> RunMetrics:
        """Fill ``real_tokens_per_sec`` = ``tokens_per_sec x (1 - padding_share)`` when not given."""
        if self.real_tokens_per_sec is None and self.tokens_per_sec is not None:
            pad = self.padding_share if self.padding_share is not None else 0.0
            self.real_tokens_per_sec = self.tokens_per_sec * (1.0 - pad)
        return self

    @property
    def throughput(self) -> float | None:
        """Samples/s, or for token workloads *real* (non-padding) tokens/s.

        ``tokens_per_sec`` counts every position of ``input_ids``, pad tokens
        included, so a patch that removes padding would look slower in it
        while doing more useful work per second.  Real tokens (the attention
        mask's sum, ``tokens_per_sec x (1 - padding_share)``) are the unit in
        which padding changes compare honestly; for runs without padding both
        are the same.
        """
        if self.unit == "tokens":
            return self.real_tokens_per_sec if self.real_tokens_per_sec is not None else self.tokens_per_sec
        return self.samples_per_sec

    @property
    def throughput_unit(self) -> str:
        """The unit of :attr:`throughput`, for labels: ``samples/s`` or ``real tokens/s``."""
        return "real tokens/s" if self.unit == "tokens" else "samples/s"


class BenchmarkResult(BaseModel):
    """Repeated, alternating runs of one configuration (no profiler on timed steps).

    ``throughputs`` holds one value per repeat (samples/s or tokens/s), in
    the order measured; ``median``/``spread`` summarise them (spread = max -
    min).  ``pair_id`` names the benchmark call that measured them: arms
    with the same ``pair_id`` ran in alternation, so repeat ``i`` of each
    forms pair ``i`` (None: measured alone).  ``stop_reason`` says why no
    further repeat was added (measure/benchmark.py, planned looks),
    ``looks`` how many times that call checked the speedup's interval,
    ``elapsed_s`` the wall-clock seconds it spent measuring, ``budget_s``
    the wall-clock budget it had (None: none) and ``measured_at`` when it
    started (local time, ``YYYY-MM-DD HH:MM:SS``).  ``cache_hit``: this
    result was replayed from the benchmark cache, not measured by the
    call that returned it.
    """

    label: Literal["baseline", "patched"]
    metrics: RunMetrics
    throughputs: list[float]
    median: float
    spread: float
    cache_key: str
    cache_hit: bool = False
    pair_id: str | None = None
    stop_reason: str = ""
    looks: int = 1
    elapsed_s: float | None = None
    budget_s: float | None = None
    measured_at: str | None = None


# --------------------------------------------------------------------------- KB / patch


class Citation(BaseModel):
    """A real public document the rule is written from."""

    title: str
    section: str
    url: str


class KeywordEdit(BaseModel):
    """A keyword argument a fix also sets in a library call of the user's script, under the name the
    installed library accepts.

    ``call`` names the calls to edit (``<args>``: ``TrainingArguments`` and
    its subclasses such as TRL's ``SFTConfig``; otherwise a regex over the
    dotted callee); ``signature`` the dotted callable whose signature, read in
    the user's interpreter, decides the name; ``names`` the keyword's names,
    preferred first (a renamed argument: ``[use_cpu, no_cuda]``); ``value``
    a literal.  A script without such a call needs nothing; a library that
    accepts none of the names (or cannot be inspected) makes the rule
    inapplicable, with that reason: never written blind.
    """

    call: str
    signature: str
    names: list[str] = Field(min_length=1)
    value: Any


class Fix(BaseModel):
    """A rule's transform.

    ``config`` assigns ConfigDict fields; values are literals or small
    arithmetic expressions written ``"=max(1, cores - dataloader_workers)"``
    over the names ``cores`` and the ConfigDict fields.  ``env`` sets
    environment variables, ``unset_env`` removes them.  ``keywords`` are
    companion keyword arguments the changed values need in the user's own
    library calls (:class:`KeywordEdit`).
    """

    config: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    keywords: list[KeywordEdit] = Field(default_factory=list)


class VersionRange(BaseModel):
    """Installed versions of one distribution a hazard applies to: ``package`` and a PEP 440
    ``specifier`` (``>=2.5,<2.6``), checked with ``packaging`` against the job's interpreter's version."""

    package: str
    specifier: str


class Rule(BaseModel):
    """One hand-written, cited rule of the knowledge base (kb/rocm_rules.yaml).

    ``kind``: ``tuning`` (a transform with a predicted recovery of
    ``targets_bucket``), ``hazard`` (a correctness or version problem: a
    warning with its source, an optional recommended fix, no predicted
    recovery; it may ``block`` patches into the hazardous path) or
    ``warning`` (something to tell the user that cannot change throughput,
    e.g. profiler variables left set).  ``affected_versions``: the installed
    versions the rule applies to (all must match; a known-bad release).
    ``devices``: device architectures or names it applies to (``gfx942``,
    ``gfx90a``, ``sm_80``, ``MI300X``, ``cpu``; empty: any).  ``blocks``: for a
    hazard that fired, the changes it forbids: ``config.<field>`` (any rule
    changing that field) or a rule id.
    """

    id: str
    kind: Literal["tuning", "hazard", "warning"] = "tuning"
    category: Literal[
        "precision", "attention", "memory", "kernels", "env_vars", "optimizer",
        "data", "compile", "collectives", "topology", "correctness", "config",
    ]
    platforms: list[Literal["rocm", "cuda", "cpu"]]
    symptom: str
    detect: list[str]
    fix: Fix = Field(default_factory=Fix)
    targets_bucket: str = "useful"
    recovery_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    expected_impact: str
    rocm_version_min: str | None = None
    torch_version_min: str | None = None
    affected_versions: list[VersionRange] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    blocks: list[str] = Field(default_factory=list)
    citation: Citation
    notes: str = ""


class RuleMatch(BaseModel):
    """A rule checked against one run: retrieval proposes, detection confirms."""

    rule_id: str
    fired: bool
    detect_score: float
    retrieval_score: float | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""


class AppliedRule(BaseModel):
    """A rule the patch applied: what it changed, why, and its source.

    ``changes`` maps a ConfigDict field (or ``env.VAR``) to ``{"from", "to"}``;
    ``predicted_recovery`` is the rule's own ``recovery_fraction x T_bucket /
    T_total`` (share of the step, 0..1) before overlaps are combined.
    """

    rule_id: str
    category: str
    targets_bucket: str
    citation: Citation
    rationale: str
    changes: dict[str, Any] = Field(default_factory=dict)
    predicted_recovery: float = 0.0


class Patch(BaseModel):
    """The proposed change: new config, unified diff of the user's own file.

    ``dropped`` says, per rule that fired but was not applied, why (a
    conflict names the rule that won and the reason); ``consistency_notes``
    say how rules that target the same waste bucket were combined.
    ``confidence = evidence_coverage x rule_consistency``.
    """

    new_config: dict[str, Any]
    diff: str
    target_file: str
    applied: list[AppliedRule] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    expected_speedup_low: float = 1.0
    expected_speedup_high: float = 1.0
    confidence: float = 0.0
    evidence_coverage: float = 0.0
    rule_consistency: float = 1.0
    consistency_notes: list[str] = Field(default_factory=list)
    patched_file: str | None = None
    #: The resolved change-set the patch was written from, as data (``audit.changeset.ChangeSet.model_dump``;
    #: ``ChangeSet.model_validate`` reads it back, ``ChangeSet.without`` re-resolves it without rules).
    change_set: dict[str, Any] | None = None
