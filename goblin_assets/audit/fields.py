"""Field synonyms and tool defaults for ``parse_config``, as data.

This is the one table of which key means which ConfigDict field in which
tool, and of what each tool does when a key is absent.  The code in
``config*.py`` only walks these tables.  All facts are from
``docs/sources.md`` ("Library defaults" and
"Field-name synonyms per tool"), which names each tool's source.

Conventions
-----------
* A synonym row is ``(field, key, converter, rank)``.  ``key`` is a dotted
  path into the (flattened) config; ``converter`` names a function in
  ``config_map.CONVERTERS``; ``rank`` orders competing candidates for the
  same field (higher wins, ties go to the row listed first).  Fields whose
  name starts with ``_`` are auxiliary facts (global batch, warmup ratio,
  DeepSpeed companion path ...) used to derive or gate real fields.
* A default is ``(value, kind, detail)``; ``UNDETERMINED`` as a value means
  the tool's default is not known to us, and ``detail`` says why.
"""
from __future__ import annotations

#: Marker for a default that cannot be stated without run-time facts.
UNDETERMINED = "<undetermined>"

# Candidate ranks (higher wins).
R_COMPANION = 20    # a DeepSpeed value that is not "auto" (it overrides the trainer)
R_EXPLICIT = 10     # the trainer's own argument / config key
R_CALL = 8          # a keyword of another call (DataLoader, LoraConfig, from_pretrained)
R_TOKENIZER = 6     # the tokenizer's from_pretrained / __call__
R_PATTERN = 5       # a code pattern (autocast, .half(), optimizer.step() under `% N`)
R_NAME = 4          # an argparse dest or module-level variable named like the field
R_ACCELERATE = 3    # accelerate config `mixed_precision` (env ACCELERATE_MIXED_PRECISION)
R_WEAK = 2          # an explicit `bf16=False` / model load dtype: weaker than a default override
R_DEFAULT = 1       # the tool's documented default

_HF_ROWS: list[tuple[str, str, str, int]] = [
    ("model_name", "model_name_or_path", "str", R_EXPLICIT),
    ("model_name", "model_name", "str", R_EXPLICIT),
    ("model_name", "base_model", "str", R_EXPLICIT),
    ("batch_size", "per_device_train_batch_size", "int", R_EXPLICIT),
    ("batch_size", "train_batch_size", "int", R_EXPLICIT - 1),          # trainer_state.json
    ("grad_accum_steps", "gradient_accumulation_steps", "int", R_EXPLICIT),
    ("seq_len", "max_length", "int", R_EXPLICIT),
    ("seq_len", "max_seq_length", "int", R_EXPLICIT),
    ("seq_len", "model_max_length", "int", R_EXPLICIT),               # stanford_alpaca subclass
    ("seq_len", "block_size", "int", R_EXPLICIT),                     # run_clm
    ("seq_len", "cutoff_len", "int", R_EXPLICIT),
    ("precision", "bf16", "flag_bf16", R_EXPLICIT),
    ("precision", "fp16", "flag_fp16", R_EXPLICIT),
    ("precision", "mixed_precision", "dtype", R_ACCELERATE),          # accelerate launch flag
    ("precision", "torch_dtype", "dtype", R_WEAK),                    # model load dtype
    ("precision", "model_init_kwargs.torch_dtype", "dtype", R_WEAK),
    ("precision", "model_init_kwargs.dtype", "dtype", R_WEAK),
    ("optimizer", "optim", "optim", R_EXPLICIT),
    ("attention_impl", "attn_implementation", "attn", R_EXPLICIT),
    ("attention_impl", "model_init_kwargs.attn_implementation", "attn", R_EXPLICIT),
    ("attention_impl", "use_flash_attention_2", "flag_flash", R_EXPLICIT),
    ("gradient_checkpointing", "gradient_checkpointing", "bool", R_EXPLICIT),
    ("lora_rank", "lora_r", "int", R_EXPLICIT),
    ("lora_rank", "lora_rank", "int", R_EXPLICIT),
    ("dataloader_workers", "dataloader_num_workers", "workers", R_EXPLICIT),
    ("lr", "learning_rate", "float", R_EXPLICIT),
    ("lr", "lr", "float", R_EXPLICIT - 1),
    ("warmup_steps", "warmup_steps", "warmup", R_EXPLICIT),
    ("warmup_steps", "num_warmup_steps", "warmup", R_EXPLICIT - 1),
    # transformers v5 `train_sampling_strategy="group_by_length"`; v4 `group_by_length=True` (kb_facts F30)
    ("group_by_length", "train_sampling_strategy", "sampling_strategy", R_EXPLICIT),
    ("group_by_length", "group_by_length", "bool", R_EXPLICIT),
    ("_warmup_ratio", "warmup_ratio", "float", R_EXPLICIT),
    ("_max_steps", "max_steps", "int", R_EXPLICIT),
    ("_deepspeed", "deepspeed", "str", R_EXPLICIT),
    ("_use_peft", "use_peft", "bool", R_EXPLICIT),
]

#: Synonym rows per tool.  A tool's rows are followed by its base tool's
#: (``TOOL_BASE``), so a later duplicate key is only a fallback.
SYNONYMS: dict[str, list[tuple[str, str, str, int]]] = {
    "hf": _HF_ROWS,
    # TRL SFTConfig packing / padding_free (kb_facts F30): several sequences per row
    "trl_sft": [
        ("padding", "packing", "flag_packed", R_EXPLICIT),
        ("padding", "padding_free", "flag_packed", R_EXPLICIT),
    ],
    "trl": [],
    "handbook": [],
    "axolotl": [
        ("model_name", "base_model", "str", R_EXPLICIT),
        ("batch_size", "micro_batch_size", "int", R_EXPLICIT),
        ("_global_batch", "batch_size", "int", R_EXPLICIT),
        ("seq_len", "sequence_len", "int", R_EXPLICIT),
        ("precision", "bf16", "auto_bf16", R_EXPLICIT),
        ("precision", "bfloat16", "flag_bf16", R_EXPLICIT),
        ("precision", "float16", "flag_fp16", R_EXPLICIT),
        ("optimizer", "optimizer", "optim", R_EXPLICIT),
        ("attention_impl", "flash_attention", "flag_flash", R_EXPLICIT),
        ("attention_impl", "sdp_attention", "flag_sdpa", R_EXPLICIT),
        ("attention_impl", "eager_attention", "flag_eager", R_EXPLICIT),
        ("attention_impl", "xformers_attention", "flag_other", R_EXPLICIT),
        ("attention_impl", "flex_attention", "flag_other", R_EXPLICIT),
        ("attention_impl", "sage_attention", "flag_other", R_EXPLICIT),
        ("attention_impl", "s2_attention", "flag_other", R_EXPLICIT),
        ("gradient_checkpointing", "gradient_checkpointing", "checkpointing", R_EXPLICIT),
        ("padding", "sample_packing", "flag_packed", R_EXPLICIT + 1),
        ("padding", "pad_to_sequence_len", "pad_to_length", R_EXPLICIT),
        ("_adapter", "adapter", "str", R_EXPLICIT),
    ],
    "llamafactory": [
        ("precision", "pure_bf16", "flag_bf16", R_EXPLICIT),
        ("attention_impl", "flash_attn", "lf_attn", R_EXPLICIT),
        ("gradient_checkpointing", "disable_gradient_checkpointing", "not_bool", R_EXPLICIT),
        ("padding", "packing", "flag_packed", R_EXPLICIT),
        ("_finetuning_type", "finetuning_type", "str", R_EXPLICIT),
    ],
    "torchtune": [
        ("model_name", "model._component_", "str", R_EXPLICIT),
        ("batch_size", "batch_size", "int", R_EXPLICIT),
        ("grad_accum_steps", "gradient_accumulation_steps", "int", R_EXPLICIT),
        ("seq_len", "tokenizer.max_seq_len", "int", R_EXPLICIT),
        ("precision", "dtype", "dtype", R_EXPLICIT),
        ("optimizer", "optimizer._component_", "optim_component", R_EXPLICIT),
        ("gradient_checkpointing", "enable_activation_checkpointing", "bool", R_EXPLICIT),
        ("lora_rank", "model.lora_rank", "int", R_EXPLICIT),
        ("lr", "optimizer.lr", "float", R_EXPLICIT),
        ("warmup_steps", "lr_scheduler.num_warmup_steps", "int", R_EXPLICIT),
        ("_packed", "dataset.packed", "bool", R_EXPLICIT),
        ("padding", "dataset.packed", "flag_packed", R_EXPLICIT),
        ("_max_steps", "max_steps_per_epoch", "int", R_EXPLICIT - 5),
    ],
    "oumi": [
        ("model_name", "model.model_name", "str", R_EXPLICIT),
        ("batch_size", "training.per_device_train_batch_size", "int", R_EXPLICIT),
        ("grad_accum_steps", "training.gradient_accumulation_steps", "int", R_EXPLICIT),
        ("seq_len", "model.model_max_length", "int", R_EXPLICIT),
        ("precision", "training.mixed_precision_dtype", "dtype", R_EXPLICIT),
        ("precision", "model.torch_dtype_str", "dtype", R_WEAK),
        ("optimizer", "training.optimizer", "optim", R_EXPLICIT),
        ("attention_impl", "model.attn_implementation", "attn", R_EXPLICIT),
        ("gradient_checkpointing", "training.enable_gradient_checkpointing", "bool", R_EXPLICIT),
        ("lora_rank", "peft.lora_r", "int", R_EXPLICIT),
        ("dataloader_workers", "training.dataloader_num_workers", "workers", R_EXPLICIT),
        ("lr", "training.learning_rate", "float", R_EXPLICIT),
        ("warmup_steps", "training.warmup_steps", "warmup", R_EXPLICIT),
        ("_warmup_ratio", "training.warmup_ratio", "float", R_EXPLICIT),
        ("_max_steps", "training.max_steps", "int", R_EXPLICIT),
    ],
    # Companions: their values join the entry file's (DeepSpeed overrides unless "auto").
    "deepspeed": [
        ("batch_size", "train_micro_batch_size_per_gpu", "int", R_COMPANION),
        ("_global_batch", "train_batch_size", "int", R_COMPANION),
        ("grad_accum_steps", "gradient_accumulation_steps", "int", R_COMPANION),
        ("precision", "bf16.enabled", "flag_bf16", R_COMPANION),
        ("precision", "fp16.enabled", "flag_fp16", R_COMPANION),
        ("optimizer", "optimizer.type", "ds_optim", R_COMPANION),
        ("lr", "optimizer.params.lr", "float", R_COMPANION),
        ("warmup_steps", "scheduler.params.warmup_num_steps", "int", R_COMPANION),
    ],
    "accelerate": [
        ("precision", "mixed_precision", "dtype", R_ACCELERATE),
        ("grad_accum_steps", "deepspeed_config.gradient_accumulation_steps", "int", R_ACCELERATE),
        ("gradient_checkpointing", "fsdp_config.fsdp_activation_checkpointing", "bool", R_ACCELERATE),
        ("_deepspeed", "deepspeed_config.deepspeed_config_file", "str", R_ACCELERATE),
    ],
    # HF trainer_state.json: run state, not the arguments (train_batch_size is
    # per_device_train_batch_size x n_gpu of one process).
    "trainer_state": [
        ("batch_size", "train_batch_size", "int", R_EXPLICIT),
        ("_max_steps", "max_steps", "int", R_EXPLICIT),
    ],
    # Regex fallback over shell launch lines: HF flags plus accelerate launch's.
    "shell": [],
    "text": [],
}

#: Inheritance of synonym rows and defaults.
TOOL_BASE: dict[str, str] = {
    "trl_sft": "hf", "trl": "hf", "handbook": "trl_sft", "axolotl": "hf",
    "llamafactory": "hf", "oumi": "hf", "shell": "hf",
}

#: Human names for the tools (source_format, provenance details).
TOOL_NAMES: dict[str, str] = {
    "hf": "transformers TrainingArguments", "trl_sft": "TRL SFTConfig", "trl": "TRL trainer config",
    "handbook": "alignment-handbook recipe (TRL SFT)", "axolotl": "axolotl", "llamafactory": "LLaMA-Factory",
    "torchtune": "torchtune", "oumi": "oumi", "deepspeed": "DeepSpeed", "accelerate": "accelerate",
    "shell": "launch command line", "trainer_state": "transformers trainer_state.json", "torch": "raw PyTorch loop", "text": "unrecognised text",
}

#: How a flattened YAML/JSON mapping is recognised: the first tool with any
#: of these keys wins (``*`` matches any key ending with the rest).
TOOL_SIGNATURES: list[tuple[str, tuple[str, ...]]] = [
    ("trainer_state", ("log_history",)),
    ("deepspeed", ("zero_optimization", "train_micro_batch_size_per_gpu", "zero_allow_untested_optimizer")),
    ("accelerate", ("compute_environment", "distributed_type")),
    ("torchtune", ("*._component_",)),
    ("oumi", ("training.per_device_train_batch_size", "training.trainer_type", "model.model_name")),
    ("axolotl", ("micro_batch_size", "sequence_len", "base_model")),
    ("llamafactory", ("finetuning_type", "cutoff_len", "stage", "template", "flash_attn")),
    ("handbook", ("dataset_mixer", "dataset_mixture", "use_flash_attention_2", "use_peft")),
    ("hf", ("*",)),
]

_HF = "transformers TrainingArguments defaults (config_formats.md, 'Library defaults')"
_TRL = "TRL SFTConfig defaults (config_formats.md, 'Library defaults')"

#: Defaults per tool: field -> (value, kind, detail).  Inherited via TOOL_BASE.
TOOL_DEFAULTS: dict[str, dict[str, tuple[object, str, str]]] = {
    "hf": {
        "batch_size": (8, "default", f"per_device_train_batch_size=8: {_HF}"),
        "grad_accum_steps": (1, "default", f"gradient_accumulation_steps=1: {_HF}"),
        "lr": (5e-5, "default", f"learning_rate=5e-5: {_HF}"),
        "warmup_steps": (0, "default", f"warmup_steps=0, warmup_ratio=0.0: {_HF}"),
        "precision": ("fp32", "default",
                      f"fp16=False, bf16=False: {_HF}; an accelerate config / ACCELERATE_MIXED_PRECISION "
                      "at launch can still turn mixed precision on"),
        "gradient_checkpointing": (False, "default", f"gradient_checkpointing=False: {_HF}"),
        "dataloader_workers": (0, "default", f"dataloader_num_workers=0: {_HF}"),
        "optimizer": (UNDETERMINED, "unset",
                      "optim not set: the transformers default depends on the installed torch "
                      "(adamw_torch, or adamw_torch_fused with torch >= 2.8, transformers PR #37358)"),
        "attention_impl": ("unknown", "default",
                           "the files never choose: transformers picks the attention at load time"),
        "lora_rank": (None, "unset", "no LoRA/PEFT rank in the files (full fine-tune or set elsewhere)"),
        "group_by_length": (False, "default", f"train_sampling_strategy='random' (v5) / group_by_length=False "
                                              f"(v4): {_HF}"),
    },
    "trl_sft": {
        "lr": (2e-5, "default", f"learning_rate=2e-5: {_TRL}"),
        "gradient_checkpointing": (True, "default",
                                   f"gradient_checkpointing=True since TRL v0.22.0 (PR #3510): {_TRL}"),
        "precision": ("bf16", "default", f"bf16=None -> True unless fp16, since TRL v0.19.0: {_TRL}"),
        "seq_len": (1024, "default", f"max_length=1024: {_TRL}"),
        "padding": ("dynamic", "default", "TRL SFTTrainer's collator pads each batch to its longest sequence "
                                          "(packing=False, padding_free=False by default)"),
    },
    "trl": {
        "lr": (UNDETERMINED, "unset", "this TRL config class overrides TrainingArguments' learning_rate; "
                                      "its default is not in our table"),
        "precision": (UNDETERMINED, "unset", "this TRL config class may override the bf16 default; "
                                             "not in our table"),
    },
    "axolotl": {
        "optimizer": ("adamw_torch_fused", "default", "axolotl optimizer default adamw_torch_fused "
                                                      "(config_formats.md, axolotl HEAD 067b021c)"),
        "gradient_checkpointing": (False, "default", "axolotl gradient_checkpointing default False"),
        "dataloader_workers": (0, "default", "axolotl dataloader_num_workers default None -> HF 0"),
        "lora_rank": (None, "unset", "no adapter: full fine-tune"),
    },
    "llamafactory": {
        "gradient_checkpointing": (True, "default", "LLaMA-Factory disable_gradient_checkpointing=False: "
                                                    "gradient checkpointing is on unless disabled"),
        "lora_rank": (8, "default", "LLaMA-Factory lora_rank=8 (finetuning_type defaults to lora)"),
        "seq_len": (2048, "default", "LLaMA-Factory cutoff_len=2048"),
        "attention_impl": ("unknown", "default", "LLaMA-Factory flash_attn=auto leaves transformers' choice alone"),
    },
    "torchtune": {
        "dataloader_workers": (0, "default", "torchtune recipes build StatefulDataLoader without num_workers: 0"),
        "attention_impl": ("sdpa", "default", "torchtune models use SDPA (flex attention only when packed: True)"),
        "gradient_checkpointing": (False, "default", "torchtune recipes read enable_activation_checkpointing, "
                                                     "False when absent"),
        "grad_accum_steps": (1, "default", "torchtune recipes: gradient_accumulation_steps 1 when absent"),
        "lora_rank": (None, "unset", "no model.lora_rank: full fine-tune"),
        "padding": ("dynamic", "default", "torchtune's padded collate pads each batch to its longest sequence "
                                          "(dataset.packed not set)"),
    },
    "oumi": {
        "gradient_checkpointing": (False, "default", "oumi enable_gradient_checkpointing default False"),
        "dataloader_workers": (0, "default", "oumi dataloader_num_workers default 0"),
    },
    "shell": {},
    "trainer_state": {},
    "handbook": {},
    "deepspeed": {},
    "accelerate": {},
    "text": {},
    # Raw PyTorch loops: what the absence of a pattern means.
    "torch": {
        "precision": ("fp32", "inferred", "no autocast, GradScaler, .half() or bfloat16 cast in the file: fp32"),
        "gradient_checkpointing": (False, "inferred", "no torch.utils.checkpoint or gradient_checkpointing_enable()"),
        "attention_impl": ("unknown", "inferred", "no attention implementation chosen in the file"),
        "lora_rank": (None, "unset", "no LoRA/PEFT config in the file"),
    },
}

#: Applies to every tool: intra-op threads are a torch process setting.
COMMON_DEFAULTS: dict[str, tuple[object, str, str]] = {
    "intra_op_threads": (None, "unset", "not set: torch default, one intra-op thread per core"),
    "padding": (None, "unset", "no padding strategy in the file: sequences are padded where the data is "
                               "tokenised or collated (tokenizer padding=, a data collator), not shown here"),
    "group_by_length": (None, "unset", "no length grouping in the file (a length-grouped sampler, or "
                                       "TrainingArguments train_sampling_strategy / group_by_length)"),
}

# --------------------------------------------------------------------------- value vocabularies

#: Precision names -> ConfigDict precision ("skip" = the key says nothing).
DTYPE_NAMES: dict[str, str] = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "torch.half": "fp16",
    "16-mixed": "fp16", "16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32", "torch.float": "fp32",
    "32": "fp32", "no": "fp32",
    "auto": "skip", "none": "skip", "null": "skip", "": "skip",
}

#: attn_implementation values -> ConfigDict attention_impl.
ATTN_NAMES: dict[str, str] = {
    "sdpa": "sdpa", "eager": "eager",
    "flash_attention_2": "flash", "flash_attention_3": "flash", "flash_attn": "flash", "flash": "flash",
    "fa2": "flash", "fa3": "flash", "kernels-community/flash-attn": "flash",
    "kernels-community/flash-attn3": "flash", "kernels-community/vllm-flash-attn3": "flash",
}

#: LLaMA-Factory ``flash_attn`` (auto|disabled|sdpa|fa2|fa3; bool before Apr 2024).
LF_FLASH_ATTN: dict[str, str] = {
    "auto": "unknown", "disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash",
    "true": "flash", "false": "skip",
}

#: Optimizer classes -> (Hugging Face `optim` name, torch default lr or None).
#: Source: docs/sources.md ("Optimizer names"); torch.optim docs
#: for the default learning rates; transformers OptimizerNames for the names.
OPTIMIZER_CLASSES: dict[str, tuple[str, float | None]] = {
    "AdamW": ("adamw_torch", 1e-3),
    "Adam": ("adam", 1e-3),
    "SGD": ("sgd", 1e-3),
    "Adagrad": ("adagrad", 1e-2),
    "RMSprop": ("rmsprop", 1e-2),
    "Adafactor": ("adafactor", None),
    "AdamW8bit": ("adamw_bnb_8bit", 1e-3),
    "PagedAdamW": ("paged_adamw_32bit", 1e-3),
    "PagedAdamW32bit": ("paged_adamw_32bit", 1e-3),
    "PagedAdamW8bit": ("paged_adamw_8bit", 1e-3),
    "Lion": ("lion_32bit", 1e-4),
}
#: With ``fused=True`` (torch) the HF name changes.
FUSED_OPTIMIZERS: dict[str, str] = {"adamw_torch": "adamw_torch_fused"}

#: Optimizers and keys that need bitsandbytes (config_formats.md hazard 14).
BNB_OPTIMIZER_PREFIXES: tuple[str, ...] = ("paged_", "adamw_bnb", "adam_bnb", "lion_8bit", "rmsprop_bnb", "adamw_8bit")
BNB_KEYS: tuple[str, ...] = ("load_in_4bit", "load_in_8bit", "bits", "quantization_bit")

# --------------------------------------------------------------------------- Python scripts

#: Config classes whose keyword arguments are TrainingArguments-like -> tool.
TRAINING_ARGS_CLASSES: dict[str, str] = {
    "TrainingArguments": "hf", "Seq2SeqTrainingArguments": "hf",
    "SFTConfig": "trl_sft",
    "DPOConfig": "trl", "ORPOConfig": "trl", "KTOConfig": "trl", "CPOConfig": "trl",
    "GRPOConfig": "trl", "RewardConfig": "trl", "PPOConfig": "trl", "RLOOConfig": "trl",
}

#: Calls whose arguments carry fields: (callee regex, {argument: (field, converter)}, rank).
#: Positional arguments are written "#0", "#1".  The first matching row wins.
CALL_FIELDS: list[tuple[str, dict[str, tuple[str, str]], int]] = [
    (r"(^|\.)\w*Tokenizer\w*\.from_pretrained$",
     {"#0": ("model_name", "str_only"), "pretrained_model_name_or_path": ("model_name", "str_only"),
      "model_max_length": ("seq_len", "int")}, R_TOKENIZER),
    (r"(^|\.)(\w*Processor|\w*Config|\w*Dataset|load_dataset)\.from_pretrained$", {}, R_CALL),
    (r"(^|\.)from_pretrained$",
     {"#0": ("model_name", "str_only"), "pretrained_model_name_or_path": ("model_name", "str_only"),
      "model_name": ("model_name", "str_only"), "attn_implementation": ("attention_impl", "attn"),
      "use_flash_attention_2": ("attention_impl", "flag_flash"),
      "max_seq_length": ("seq_len", "int")}, R_CALL),
    (r"(^|\.)LoraConfig$", {"r": ("lora_rank", "int")}, R_CALL),
    (r"(^|\.)get_peft_model$",
     {"r": ("lora_rank", "int"), "use_gradient_checkpointing": ("gradient_checkpointing", "checkpointing")}, R_CALL),
    (r"(^|\.)DataLoader$", {"batch_size": ("batch_size", "int"), "num_workers": ("dataloader_workers", "int")}, R_CALL),
    (r"(^|\.)set_num_threads$", {"#0": ("intra_op_threads", "int")}, R_CALL),
    (r"(^|\.)get_\w*schedule\w*_with_warmup$",
     {"num_warmup_steps": ("warmup_steps", "int"), "#1": ("warmup_steps", "int")}, R_CALL),
    (r"(^|\.)get_scheduler$", {"num_warmup_steps": ("warmup_steps", "int"), "#2": ("warmup_steps", "int")}, R_CALL),
    (r"(^|\.)(\w+Trainer|Trainer)$", {"model": ("model_name", "str_only")}, R_CALL),
    (r"(^|\.)autocast$", {"dtype": ("precision", "dtype"), "#1": ("precision", "dtype")}, R_PATTERN),
    (r"<tokenizer>", {"max_length": ("seq_len", "int"), "padding": ("padding", "tokenizer_padding")}, R_TOKENIZER),
]

#: Dtype keywords of from_pretrained: the model's load dtype (weaker than trainer flags).
LOAD_DTYPE_ARGS: tuple[str, ...] = ("torch_dtype", "dtype")

#: Defaults of calls that omit an argument: callee regex -> {field: (value, detail)}.
#: Source: torch.utils.data.DataLoader docs (batch_size=1, num_workers=0).
CALL_DEFAULTS: list[tuple[str, dict[str, tuple[object, str]]]] = [
    (r"(^|\.)DataLoader$", {"batch_size": (1, "torch DataLoader default batch_size=1"),
                            "dataloader_workers": (0, "torch DataLoader default num_workers=0")}),
]

#: Calls that turn gradient checkpointing on (config_formats.md hazard 5: peft's
#: prepare_model_for_kbit_training defaults use_gradient_checkpointing=True).
CHECKPOINTING_CALLS: dict[str, str] = {
    "gradient_checkpointing_enable": "model.gradient_checkpointing_enable() is called",
    "prepare_model_for_kbit_training": "peft prepare_model_for_kbit_training() turns gradient checkpointing on",
    "prepare_model_for_int8_training": "peft prepare_model_for_int8_training() turns gradient checkpointing on",
    "checkpoint_sequential": "torch.utils.checkpoint.checkpoint_sequential is used",
}
#: ``checkpoint(...)`` counts only when imported from torch.utils.checkpoint.
CHECKPOINT_MODULE = "torch.utils.checkpoint"

#: Method calls that set the compute dtype: method -> precision.
PRECISION_METHODS: dict[str, str] = {"half": "fp16", "bfloat16": "bf16"}
#: ``GradScaler`` exists for fp16 (torch.amp docs: "not needed for bfloat16").
GRAD_SCALER = "GradScaler"
#: torch.autocast without dtype: float16 on cuda, bfloat16 on cpu (torch.amp docs).
AUTOCAST_DEFAULT_DTYPE: dict[str, str] = {"cuda": "fp16", "cpu": "bf16", "xpu": "bf16", "hpu": "bf16"}

#: Collators (and helpers) that pad each batch: name -> ConfigDict padding.
#: Their own ``padding="max_length"`` argument, when given, wins (read with
#: the ``tokenizer_padding`` converter).  Source: transformers data collator
#: docs (DataCollatorWithPadding pads "to the longest sequence in the batch"
#: by default); torch.nn.utils.rnn.pad_sequence; padding_free docs for
#: DataCollatorWithFlattening (kb_facts F30).
PADDING_COLLATORS: dict[str, str] = {
    "DataCollatorWithPadding": "dynamic", "DataCollatorForSeq2Seq": "dynamic",
    "DataCollatorForTokenClassification": "dynamic", "DataCollatorForLanguageModeling": "dynamic",
    "DataCollatorForCompletionOnlyLM": "dynamic", "pad_sequence": "dynamic",
    "DataCollatorWithFlattening": "packed",
}
#: A Trainer given a tokenizer and no ``data_collator`` builds a
#: DataCollatorWithPadding itself (transformers Trainer docs, ``data_collator``).
TRAINER_TOKENIZER_KWARGS: tuple[str, ...] = ("processing_class", "tokenizer")
TRAINER_CALL = r"(^|\.)(\w+Trainer|Trainer)$"

#: Calls and imports that choose an attention kernel in raw code.
ATTENTION_CALLS: dict[str, str] = {
    "scaled_dot_product_attention": "sdpa",
    "flash_attn_func": "flash", "flash_attn_varlen_func": "flash", "flash_attn_qkvpacked_func": "flash",
}
ATTENTION_IMPORTS: dict[str, str] = {"flash_attn": "flash"}

#: Run-time checks assumed True on the target (cases README: AMD MI300X, ROCm).
RUNTIME_TRUE: dict[str, str] = {
    "is_bf16_supported": "torch.cuda.is_bf16_supported() returns True unconditionally on ROCm "
                         "(target MI300X); runtime-dependent elsewhere",
    "is_torch_bf16_gpu_available": "is_torch_bf16_gpu_available() is True on MI300X (ROCm); runtime-dependent",
    "is_available": "assumes a GPU is present (target MI300X); runtime-dependent",
}

#: Argparse dests and module-level variables that name a field (lower case),
#: in priority order.  Only the DataLoader's workers count, not preprocessing
#: workers (config_formats.md hazard 9).
PY_NAMES: dict[str, tuple[str, ...]] = {
    "model_name": ("model_name_or_path", "model_name", "base_model", "model_id", "model", "init_from",
                   "pretrained_model_name_or_path"),
    "batch_size": ("per_device_train_batch_size", "micro_batch_size", "batch_size", "train_batch_size", "bs"),
    "grad_accum_steps": ("gradient_accumulation_steps", "grad_accum_steps", "grad_accum", "accum_steps",
                         "accumulation_steps", "accum"),
    "seq_len": ("max_seq_length", "max_seq_len", "seq_len", "seq_length", "max_length", "block_size",
                "cutoff_len", "context_length", "model_max_length", "sequence_len"),
    "precision": ("dtype", "precision", "mixed_precision"),
    "lora_rank": ("lora_r", "lora_rank"),
    "dataloader_workers": ("dataloader_num_workers", "num_workers", "workers", "n_workers"),
    "lr": ("learning_rate", "lr", "max_lr"),
    "warmup_steps": ("warmup_steps", "num_warmup_steps", "warmup_iters", "warmup"),
    "gradient_checkpointing": ("gradient_checkpointing",),
}
#: Converter applied to a PY_NAMES value, per field.
PY_NAME_CONVERTERS: dict[str, str] = {
    "model_name": "model_id", "batch_size": "int", "grad_accum_steps": "int", "seq_len": "int",
    "precision": "dtype", "lora_rank": "int", "dataloader_workers": "int", "lr": "float",
    "warmup_steps": "int", "gradient_checkpointing": "bool",
}
#: Why a field is null when a script never mentions it, where the generic
#: "not found" would say too little.
NOT_FOUND_REASONS: dict[str, str] = {
    "model_name": "the model is built in code or loaded elsewhere: no from_pretrained(...) id, "
                  "model argument or init_from variable",
    "seq_len": "no sequence length in the file (no tokenizer max_length, block_size or seq_len argument); "
               "the data may not be token sequences",
}
#: Tools whose files are not argument sets: a missing key means "not recorded".
NOT_RECORDED_TOOLS: dict[str, str] = {
    "trainer_state": "trainer_state.json records run state, not the training arguments "
                     "(read training_args.json / training_args.bin beside it)",
}
#: nanoGPT ``init_from`` values that are not a model id.
NOT_MODEL_IDS: tuple[str, ...] = ("scratch", "resume")

# --------------------------------------------------------------------------- warnings

#: Environment-variable prefixes that configure a profiler, not the workload
#: (DESIGN.md: "ROCPROFSYS_* ... never a rule, always a warning").
PROFILER_ENV_PREFIXES: dict[str, str] = {
    "ROCPROFSYS_": "configures the rocprof-sys profiler, not the workload: not a tuning knob",
    "OMNITRACE_": "configures the omnitrace profiler (now rocprof-sys), not the workload: not a tuning knob",
}

#: Keys that are deprecated, renamed or removed, per tool (config_formats.md hazard 13).
DEPRECATED_KEYS: dict[str, dict[str, str]] = {
    "hf": {
        "evaluation_strategy": "transformers renamed evaluation_strategy to eval_strategy",
        "warmup_ratio": "warmup_ratio is deprecated in transformers v5 (PR #41326); "
                        "warmup_steps < 1 now means a ratio",
    },
    "trl_sft": {
        "max_seq_length": "TRL deprecated max_seq_length in v0.16.0 and removed it in v0.20.0: use max_length",
    },
    "axolotl": {
        "flash_attention": "legacy axolotl flag: newer axolotl uses attn_implementation (commit e4032fc9)",
        "sdp_attention": "legacy axolotl flag: newer axolotl uses attn_implementation (commit e4032fc9)",
        "xformers_attention": "legacy axolotl flag: newer axolotl uses attn_implementation (commit e4032fc9)",
    },
}

# --------------------------------------------------------------------------- gates and derivations

#: LoRA rank only counts when the tool trains an adapter: tool -> (aux field,
#: values that enable LoRA, value when the key is absent).  Sources:
#: LLaMA-Factory finetuning_type (default lora), axolotl adapter (lora|qlora),
#: alignment-handbook/TRL ModelConfig use_peft (default False).
LORA_GATES: dict[str, tuple[str, tuple[object, ...], object]] = {
    "llamafactory": ("_finetuning_type", ("lora",), "lora"),
    "axolotl": ("_adapter", ("lora", "qlora"), None),
    "handbook": ("_use_peft", (True,), False),
}

#: Tools whose gradient accumulation defaults to global // micro batch when
#: unset (axolotl: `gradient_accumulation_steps or batch_size // micro_batch_size`).
GA_FROM_GLOBAL_BATCH: tuple[str, ...] = ("axolotl",)

#: Tools that an accelerate config beside the entry file can affect (HF
#: Trainer reads ACCELERATE_MIXED_PRECISION; config_formats.md hazard 4).
ACCELERATE_TOOLS: tuple[str, ...] = ("hf", "trl_sft", "trl", "handbook", "shell", "axolotl", "llamafactory")

#: File suffix -> format; other suffixes are sniffed from the content.
FORMATS_BY_SUFFIX: dict[str, str] = {
    ".py": "python", ".json": "json", ".yaml": "yaml", ".yml": "yaml",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".slurm": "shell", ".sbatch": "shell",
}

#: ConfigDict fields whose values are booleans (elsewhere a bool is not a valid value).
BOOL_FIELDS: tuple[str, ...] = ("gradient_checkpointing", "group_by_length")

#: Smallest meaningful value per numeric field; below it the value is reported
#: as undetermined with a warning (a typo or a sentinel such as -1).
FIELD_MINIMUMS: dict[str, float] = {
    "batch_size": 1, "grad_accum_steps": 1, "seq_len": 1, "lora_rank": 1,
    "dataloader_workers": 0, "intra_op_threads": 1, "warmup_steps": 0, "lr": 1e-12,
}


# --------------------------------------------------------------------------- patching

#: Where the patch stage writes a field that a Python script does not set yet,
#: in order of preference: ``(call, keyword, converter, requires)``.  ``call``
#: is a callee regex, ``<args>`` (the trainer-arguments call, e.g.
#: ``TrainingArguments(...)``) or ``<tokenizer>`` (calls of a tokenizer
#: variable).  ``converter`` renders the ConfigDict value in the keyword's own
#: vocabulary (``config_map.render_value``); ``requires`` is ``(distribution,
#: min_version, max_version)`` or None: the key only exists in those versions
#: of the library the patched file runs with.
MODEL_FROM_PRETRAINED = r"(^|\.)(AutoModel\w*|\w+For\w+|\w+LMHeadModel)\.from_pretrained$"
PY_INSERT: dict[str, list[tuple[str, str, str, tuple[str, str | None, str | None] | None]]] = {
    "attention_impl": [(MODEL_FROM_PRETRAINED, "attn_implementation", "attn", None)],
    "batch_size": [("<args>", "per_device_train_batch_size", "int", None),
                   (r"(^|\.)DataLoader$", "batch_size", "int", None)],
    "grad_accum_steps": [("<args>", "gradient_accumulation_steps", "int", None)],
    "precision": [("<args>", "bf16", "flag_bf16", None), ("<args>", "fp16", "flag_fp16", None)],
    "optimizer": [("<args>", "optim", "optim", None)],
    "gradient_checkpointing": [("<args>", "gradient_checkpointing", "bool", None)],
    "dataloader_workers": [("<args>", "dataloader_num_workers", "workers", None),
                           (r"(^|\.)DataLoader$", "num_workers", "int", None)],
    "lr": [("<args>", "learning_rate", "float", None)],
    "warmup_steps": [("<args>", "warmup_steps", "warmup", None)],
    "lora_rank": [(r"(^|\.)LoraConfig$", "r", "int", None)],
    "padding": [("<tokenizer>", "padding", "tokenizer_padding", None)],
    # kb_facts F30: v4 `group_by_length=True`, v5 `train_sampling_strategy="group_by_length"`
    "group_by_length": [("<args>", "train_sampling_strategy", "sampling_strategy", ("transformers", "5.0", None)),
                        ("<args>", "group_by_length", "bool", ("transformers", None, "5.0"))],
}
#: Keys of a YAML/JSON tool that only exist in some versions of the library
#: that reads them: (tool, key) -> (distribution, min_version, max_version).
VERSIONED_KEYS: dict[tuple[str, str], tuple[str, str | None, str | None]] = {
    ("hf", "train_sampling_strategy"): ("transformers", "5.0", None),
    ("hf", "group_by_length"): ("transformers", None, "5.0"),
}
#: Values a keyword already has when it is absent (nothing to insert then).
PY_KEYWORD_DEFAULTS: dict[tuple[str, str], object] = {
    ("<tokenizer>", "padding"): False,   # tokenizers do not pad unless asked
}
#: Fields set by a statement rather than a keyword: field -> (statement
#: template, the import it needs, comment).  Inserted after the imports.
PY_STATEMENTS: dict[str, tuple[str, str, str]] = {
    "intra_op_threads": ("torch.set_num_threads({value})", "torch",
                         "main-process intra-op threads, sized together with the data-loader workers"),
}
#: Code a value needs besides its own keyword: (field, value) -> (calls that
#: consume the batches, in order, as (callee regex, keyword); the expression
#: to pass, with ``{tokenizer}`` the script's tokenizer variable; the import
#: line it needs; the names already meeting the need).  Dynamic padding needs
#: a collator that pads each batch (transformers DataCollatorWithPadding).
PY_VALUE_NEEDS: dict[tuple[str, object], tuple[tuple[tuple[str, str], ...], str, str, tuple[str, ...]]] = {
    ("padding", "dynamic"): (
        ((TRAINER_CALL, "data_collator"), (r"(^|\.)DataLoader$", "collate_fn")),
        "DataCollatorWithPadding({tokenizer})",
        "from transformers import DataCollatorWithPadding",
        tuple(k for k, v in PADDING_COLLATORS.items() if v == "dynamic"),
    ),
}
