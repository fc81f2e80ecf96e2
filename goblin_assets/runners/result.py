"""What a run leaves behind: the child harness's ``result.json`` as a model, and the RawRun around it.

The protocol layer of the runners: :mod:`goblin_assets.runners.base` (the
Runner protocol), every runner and every reader of a run import these types
from here, and this module imports no runner.

* :class:`HarnessResult` is the one schema of ``RUN_DIR/result.json``: the
  child (:mod:`goblin_assets.runners.harness`) writes it with
  :meth:`HarnessResult.write`, the parent reads it back with
  :meth:`HarnessResult.read`, which names the file and the first invalid
  field instead of raising a traceback from deep inside a reader.
* :class:`RawRun` is what ``Runner.run`` returns: the parsed result, the
  run's folder and, for a runner that measures nothing itself (replay), the
  finished :class:`~goblin_assets.contracts.RunMetrics` in ``metrics``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from goblin_assets.contracts import RunMetrics
from goblin_assets.errors import GoblinError

Mode = Literal["profile", "benchmark", "sketch"]

#: The file the harness writes into its run folder.
RESULT_NAME = "result.json"

M = TypeVar("M", bound=BaseModel)


def read_json_model(path: str | Path, model: type[M], error: type[GoblinError]) -> M:
    """Read a JSON file as a pydantic ``model``.

    Raises
    ------
    error
        The file is missing or unreadable, not JSON, or fails validation; the
        message names the file and the first invalid field (``field
        'per_step.0.samples': ...``).
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{p}: not a JSON file ({exc})") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise error(f"{p}: field '{where}': {first['msg']}") from None


class HarnessResultError(GoblinError):
    """A ``result.json`` that is missing, not JSON, or not a HarnessResult (names the file and the field)."""


class StepRecord(BaseModel):
    """One measured optimizer step, as the harness counted it.

    Units: counts of samples / tokens / non-padding tokens / data-loader
    batches seen during the step; ``data_wait_s`` seconds spent inside the
    data loader's ``__next__``; ``step_time_s`` seconds from the previous
    optimizer step to this one; ``t_start_s``/``t_end_s`` the step's bounds
    on CLOCK_MONOTONIC (``time.perf_counter`` on Linux), seconds, so they line
    up with rocprofv3's nanosecond timestamps.
    """

    model_config = ConfigDict(extra="forbid")

    samples: int = Field(ge=0)
    tokens: int = Field(ge=0)
    nonpad_tokens: int = Field(ge=0)
    data_wait_s: float = Field(ge=0)
    batches: int = Field(ge=0)
    step_time_s: float = Field(ge=0)
    t_start_s: float
    t_end_s: float


class OpTime(BaseModel):
    """One op of the profiler's ``key_averages``: self time and calls.

    ``self_us`` is µs of device time on GPU runs, of CPU time on CPU runs.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    self_us: float
    count: int


class PyWarning(BaseModel):
    """A Python warning the user's script raised, deduplicated by category and message.

    ``where`` is ``file:line`` of its first occurrence, ``step`` the optimizer
    step (from 1) during which it first came, ``count`` how many times it came.
    """

    model_config = ConfigDict(extra="forbid")

    category: str
    message: str
    where: str
    count: int = Field(ge=1)
    step: int = Field(ge=1)


class ObservedLoader(BaseModel):
    """One DataLoader the script iterated, as constructed (``runners/observe.py``).

    ``batch_size`` in samples per batch (the batch sampler's when the loader
    has none of its own); ``step`` the optimizer step (from 1) during which it
    was first iterated; ``where`` the first frame outside torch,
    accelerate and transformers that iterated it (``file:line``).
    """

    model_config = ConfigDict(extra="forbid")

    cls: str
    batch_size: int | None = None
    num_workers: int = Field(ge=0)
    pin_memory: bool
    prefetch_factor: int | None = None
    persistent_workers: bool
    drop_last: bool
    sampler: str | None = None
    dataset: str | None = None
    step: int = Field(ge=1)
    iterations: int = Field(ge=1)
    where: str | None = None


class ObservedGroup(BaseModel):
    """One parameter group of an optimizer at its first step: ``lr`` the base (``initial_lr`` of a scheduler,
    else ``lr``), ``lr_now`` the value at that step, ``params`` its tensors.  ``eps`` is a pair for
    ``torch.optim.Adafactor`` (``(None, 1e-3)``: eps1 None means the dtype's own epsilon)."""

    model_config = ConfigDict(extra="forbid")

    lr: float | None = None
    lr_now: float | None = None
    betas: list[float | None] | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    eps: float | list[float | None] | None = None
    params: int = Field(ge=0)


class ObservedOptimizer(BaseModel):
    """One optimizer the script stepped: class, module, groups, ``fused`` / ``foreach`` (None: left to torch)."""

    model_config = ConfigDict(extra="forbid")

    cls: str
    module: str
    groups: list[ObservedGroup] = Field(default_factory=list)
    fused: bool | None = None
    foreach: bool | None = None
    step: int = Field(ge=1)


class ObservedScheduler(BaseModel):
    """An LR scheduler constructed: class and the warm-up steps the object states (None: not stated)."""

    model_config = ConfigDict(extra="forbid")

    cls: str
    warmup_steps: int | float | None = None
    detail: str = ""


class ObservedAutocast(BaseModel):
    """A ``torch.autocast`` region entered: device type, dtype, enabled, where first entered, how often,
    whether gradients were on (``training``) and the optimizer step (from 1) of its first entry."""

    model_config = ConfigDict(extra="forbid")

    device_type: str
    dtype: str | None = None
    enabled: bool
    where: str | None = None
    count: int = Field(ge=1)
    training: bool
    first_step: int = Field(ge=1)


class ObservedBatch(BaseModel):
    """The batch field of one of the first batches: ``shape`` and ``dtype``; with a mask, ``padded_rows``
    (rows with a pad position) and ``longest`` (the longest row's real tokens).  A token batch without a
    mask whose rows end in runs of one id gives the same two from those runs, with ``pad_id`` and
    ``pad_from`` (how the pad positions were told)."""

    model_config = ConfigDict(extra="forbid")

    shape: list[int] | None = None
    dtype: str | None = None
    step: int = Field(ge=1)
    padded_rows: int | None = None
    longest: int | None = None
    pad_id: int | None = None
    pad_from: str | None = None


class ObservedModel(BaseModel):
    """The module holding the stepped parameters: class, its config's name/path and attention
    implementation, whether gradient checkpointing is on, ``nn.MultiheadAttention`` modules."""

    model_config = ConfigDict(extra="forbid")

    cls: str
    name_or_path: str | None = None
    attn_implementation: str | None = None
    config_class: str | None = None
    gradient_checkpointing: bool
    attention_modules: int = Field(ge=0)


class ObservedAdapter(BaseModel):
    """A peft adapter on the model: its name, type, rank ``r``, ``lora_alpha`` and target modules."""

    model_config = ConfigDict(extra="forbid")

    name: str
    peft_type: str | None = None
    r: int | None = None
    lora_alpha: float | None = None
    target_modules: list[str] | str | None = None


#: The observed settings the harness writes after each warm-up step (``harness.OBSERVED_NAME``: the names must
#: agree), read when the run fails or hangs before writing its result.
OBSERVED_NAME = "observed.json"


class ObservedRecord(BaseModel):
    """The settings the running program used, recorded by the harness (``runners/observe.py``, issue 27).

    Counts per optimizer step (the first 64): ``backward_per_step`` (calls of
    ``torch.autograd.backward``: gradient accumulation as it ran) and
    ``batches_per_step``.  ``param_dtypes`` / ``grad_dtypes``: trainable
    tensors per dtype at the first step.  ``checkpoint_calls`` /
    ``sdpa_calls``: calls of ``torch.utils.checkpoint.checkpoint`` and
    ``scaled_dot_product_attention`` over the run; ``sdpa_backends`` the SDPA
    backends torch had enabled (CUDA/ROCm only).  ``threads``:
    ``torch.get_num_threads()`` at the first step.  ``training_arguments`` /
    ``lightning_trainer``: the trainer objects' own values when the script
    built one (the harness caps ``max_steps``).  ``errors``: what could not be
    read (the script ran on regardless).
    """

    model_config = ConfigDict(extra="forbid")

    loaders: list[ObservedLoader] = Field(default_factory=list)
    optimizers: list[ObservedOptimizer] = Field(default_factory=list)
    schedulers: list[ObservedScheduler] = Field(default_factory=list)
    backward_per_step: list[int] = Field(default_factory=list)
    batches_per_step: list[int] = Field(default_factory=list)
    autocast: list[ObservedAutocast] = Field(default_factory=list)
    grad_scaler: dict[str, Any] | None = None
    param_dtypes: dict[str, int] = Field(default_factory=dict)
    grad_dtypes: dict[str, int] = Field(default_factory=dict)
    checkpoint_calls: int = Field(default=0, ge=0)
    sdpa_calls: int = Field(default=0, ge=0)
    sdpa_backends: dict[str, bool] = Field(default_factory=dict)
    batches: list[ObservedBatch] = Field(default_factory=list)
    #: the stepped model's own inputs (first tensor argument of its calls) when no DataLoader was iterated
    inputs: list[ObservedBatch] = Field(default_factory=list)
    model: ObservedModel | None = None
    adapter: ObservedAdapter | None = None
    training_arguments: dict[str, Any] | None = None
    lightning_trainer: dict[str, Any] | None = None
    threads: int | None = None
    steps: int = Field(default=0, ge=0)
    errors: list[str] = Field(default_factory=list)
    most_common_backward: int | None = None


class HarnessResult(BaseModel):
    """Everything the child harness reports to the parent (``RUN_DIR/result.json``).

    ``device`` is ``cuda`` (CUDA or ROCm: both use the ``torch.cuda`` API) or
    ``cpu`` (also a GPU run that allocated nothing on the GPU; a warning says
    so).  Memory in GB (1e9 bytes): ``max_rss_gb`` and ``rss_gb_samples`` (one
    per measured step) are the child's host RSS; ``mem_peak_gb`` (device
    peak), ``mem_static_gb`` (allocated after the optimizer step: weights,
    grads, optimizer state) and ``mem_total_gb`` only on ``cuda``.  ``trace``
    (the Chrome trace's path), ``ops`` (the top 50 ops by self time) and
    ``flops_total`` (FLOPs torch.profiler counted with ``with_flops``) only
    in ``profile`` mode.  ``num_threads`` is torch's intra-op thread count.
    ``python`` is the interpreter the child ran in; ``prefetch_warmup_steps``
    the optimizer steps added to the warm-up to drain the DataLoader's prefetch
    queue (steady state); ``dataset_class`` and ``dataset_in_memory`` the first
    loader's dataset class and whether its items are slices of in-memory
    tensors (``TensorDataset``); ``dataset_samples`` the length of the first
    DataLoader's dataset (None for an iterable dataset); ``nonfinite_params``
    the parameters of the stepped optimizers that held NaN/Inf at the end
    (described by place, shape and dtype; at most 10); ``first_nonfinite_step``
    the first optimizer step (counting warm-up, from 1) after which one did,
    as far as checked (every warm-up step; every step in ``sketch`` mode).
    The run's own signals: ``python_warnings`` (deduplicated, first 50),
    ``losses`` (each optimizer step's last scalar ``.backward()`` value, from
    step 1; ``"nan"``/``"inf"`` as strings; None where no scalar backward was
    seen), ``grads_missing`` (per step, trainable parameters of the stepped
    optimizers whose ``.grad`` was None at the step) and ``params_trainable``.
    ``observed``: the settings the program ran with (:class:`ObservedRecord`;
    None from a harness older than issue 27).
    ``invariants``: the raw measurements of the run-time invariant checks
    (:mod:`goblin_assets.runners.invariants`, ``profile`` mode only; None otherwise),
    judged by :mod:`goblin_assets.measure.invariants`.
    ``memory`` is the harness's memory record
    (:class:`~goblin_assets.runners.memory_probe.MemoryRecorder`): ``census``
    (live tensor bytes by role when the warm-up ended; None in ``benchmark``
    mode), ``rss_bytes_by_step`` and, in a memory probe,
    ``saved_activation_bytes_by_step``.
    ``all_step_times_s``: the seconds of every optimizer step the harness
    ran, warm-up included (step 1 first; step 1 counts from the script's start).
    ``saves``: every ``torch.save`` of the run (a checkpoint save), at most 200:
    ``{"step"`` (the optimizer step it ran in, 1-based), ``"seconds"``,
    ``"where"`` (``file:line in function`` of the innermost caller outside torch)``}``.
    Host facts (cores, CPU instruction sets) are not the harness's to report:
    they come from :mod:`goblin_assets.host`.
    """

    model_config = ConfigDict(extra="forbid")

    warnings: list[str] = Field(default_factory=list)
    reached_budget: bool
    steps_seen: int = Field(ge=0)
    per_step: list[StepRecord] = Field(default_factory=list)
    device: Literal["cpu", "cuda"]
    torch_version: str
    hip_version: str | None = None
    cuda_version: str | None = None
    num_threads: int = Field(ge=1)
    max_rss_gb: float = Field(ge=0)
    rss_gb_samples: list[float] = Field(default_factory=list)
    memory: dict[str, Any] | None = None
    device_name: str | None = None
    device_arch: str | None = None
    mem_peak_gb: float | None = None
    mem_static_gb: float | None = None
    mem_total_gb: float | None = None
    trace: str | None = None
    ops: list[OpTime] = Field(default_factory=list)
    flops_total: int = Field(default=0, ge=0)
    python: str | None = None
    prefetch_warmup_steps: int = Field(default=0, ge=0)
    dataset_samples: int | None = Field(default=None, ge=0)
    dataset_class: str | None = None
    dataset_in_memory: bool | None = None
    nonfinite_params: list[str] = Field(default_factory=list)
    first_nonfinite_step: int | None = None
    all_step_times_s: list[float] = Field(default_factory=list)
    saves: list[dict[str, Any]] = Field(default_factory=list)
    python_warnings: list[PyWarning] = Field(default_factory=list)
    losses: list[float | str | None] = Field(default_factory=list)
    grads_missing: list[int] = Field(default_factory=list)
    params_trainable: int = Field(default=0, ge=0)
    observed: ObservedRecord | None = None
    invariants: dict[str, Any] | None = None
    dynamo: dict[str, Any] | None = None  # torch.compile's record (runners/compile_probe.py; measure/compile_counters)

    @property
    def trace_path(self) -> Path | None:
        """The Chrome trace the harness wrote (``profile`` mode), else None."""
        return Path(self.trace) if self.trace else None

    def write(self, run_dir: str | Path) -> Path:
        """Write ``RUN_DIR/result.json`` and return its path."""
        p = Path(run_dir) / RESULT_NAME
        p.write_text(self.model_dump_json(), encoding="utf-8")
        return p

    @classmethod
    def read(cls, path: str | Path) -> HarnessResult:
        """Read and validate a ``result.json``.

        Raises
        ------
        HarnessResultError
            The file is missing, not JSON, or fails validation; the message
            names the file and the first invalid field (``per_step.0.samples``).
        """
        return read_json_model(path, cls, HarnessResultError)


@dataclass
class RawRun:
    """What one ``Runner.run`` left behind.

    ``ok`` is False with ``failure`` (one sentence naming the script and the
    reason) when the child timed out, was killed, exited non-zero, ended
    before its warm-up or wrote no valid ``result.json``; ``stderr_tail`` is
    the end of its stderr and ``wall_s`` its wall-clock seconds.  ``result``
    is the harness's report (None when the child wrote none).  ``extra``
    holds a runner's own findings beyond the harness's, read back by the same
    runner's ``fold_metrics`` (the rocprof runner: ``extra["rocprof"]``).
    ``metrics`` is set by a runner that returns finished RunMetrics instead
    of running anything (the replay runner, also on failure); ``profile_run``
    returns it as it is.
    """

    ok: bool
    run_dir: Path
    mode: Mode
    result: HarnessResult | None = None
    failure: str | None = None
    stderr_tail: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    metrics: RunMetrics | None = None

    @property
    def trace_path(self) -> Path | None:
        """The run's Chrome trace (``profile`` mode of a measured run), else None."""
        return self.result.trace_path if self.result is not None else None
