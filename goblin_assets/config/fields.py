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
* Library defaults of the classes files build (``TrainingArguments``, TRL's
  config family, peft ``LoraConfig``, torch optimizers, oumi, torchtitan,
  torchtune recipes) are one table, ``CLASS_DEFAULTS``, keyed by class, each
  set with its library, version and source file; ``TOOL_DEFAULTS`` holds
  what no class key states (e.g. why an optimizer is undetermined).
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
        ("_use_peft", "training.use_peft", "bool", R_EXPLICIT),
    ],
    # torchtitan TOML (JobConfig sections; torchtitan v0.2.2 torchtitan/config/job_config.py)
    "torchtitan": [
        ("batch_size", "training.local_batch_size", "int", R_EXPLICIT),
        ("batch_size", "training.batch_size", "int", R_EXPLICIT - 1),       # before local_batch_size existed
        ("_global_batch", "training.global_batch_size", "global_batch", R_EXPLICIT),
        ("seq_len", "training.seq_len", "int", R_EXPLICIT),
        ("precision", "training.dtype", "titan_dtype", R_EXPLICIT + 1),     # bfloat16: everything in bf16
        ("precision", "training.mixed_precision_param", "dtype", R_EXPLICIT),
        ("optimizer", "optimizer.name", "titan_optim", R_EXPLICIT),
        ("lr", "optimizer.lr", "float", R_EXPLICIT),
        ("warmup_steps", "lr_scheduler.warmup_steps", "int", R_EXPLICIT),
        ("gradient_checkpointing", "activation_checkpoint.mode", "titan_ac", R_EXPLICIT),
        ("dataloader_workers", "training.dataloader.num_workers", "workers", R_EXPLICIT),
        ("_max_steps", "training.steps", "int", R_EXPLICIT),
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

#: The library class whose defaults a tool's files fall back on (a key of
#: CLASS_DEFAULTS); a Python script names its own class (``DPOConfig(...)``).
TOOL_CLASS: dict[str, str] = {
    "hf": "TrainingArguments", "trl_sft": "SFTConfig", "trl": "trl.BaseConfig",
    "oumi": "oumi.TrainingConfig", "torchtitan": "torchtitan.JobConfig", "torchtune": "torchtune.recipe",
}

#: Human names for the tools (source_format, provenance details).
TOOL_NAMES: dict[str, str] = {
    "hf": "transformers TrainingArguments", "trl_sft": "TRL SFTConfig", "trl": "TRL trainer config",
    "handbook": "alignment-handbook recipe (TRL SFT)", "axolotl": "axolotl", "llamafactory": "LLaMA-Factory",
    "torchtune": "torchtune", "oumi": "oumi", "deepspeed": "DeepSpeed", "accelerate": "accelerate",
    "shell": "launch command line", "trainer_state": "transformers trainer_state.json", "torch": "raw PyTorch loop", "text": "unrecognised text",
    "torchtitan": "torchtitan", "unknown": "a format Goblin does not know",
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
    ("torchtitan", ("training.local_batch_size", "training.seq_len", "parallelism.data_parallel_shard_degree",
                    "activation_checkpoint.mode", "job.dump_folder")),
]

#: TrainingArguments keys: a mapping with none of the signatures above is the
#: Trainer's only when enough of its keys are these (``detect_tool``); else its
#: format is unknown and no defaults apply (issue 17).  Source: transformers
#: ``TrainingArguments`` fields (training_args.py).
HF_ARG_KEYS: frozenset[str] = frozenset((
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy",
    "evaluation_strategy", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "eval_accumulation_steps", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "num_train_epochs", "max_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio",
    "warmup_steps", "log_level", "logging_dir", "logging_strategy", "logging_steps", "save_strategy", "save_steps",
    "save_total_limit", "seed", "data_seed", "bf16", "fp16", "tf32", "local_rank", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_drop_last", "eval_steps", "run_name", "remove_unused_columns",
    "load_best_model_at_end", "metric_for_best_model", "deepspeed", "fsdp", "optim", "group_by_length",
    "report_to", "ddp_find_unused_parameters", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "push_to_hub", "hub_model_id", "torch_compile", "train_sampling_strategy", "model_name_or_path",
    "max_seq_length", "max_length", "packing", "dataset_text_field", "use_peft", "lora_r", "model_max_length",
    "cutoff_len", "block_size",
))
#: A flattened YAML/JSON with no tool signature is read as TrainingArguments when
#: at least this many of its top-level keys are TrainingArguments keys, or
#: this share of them (a short args dump); otherwise its format is unknown.
HF_MIN_KEYS = 3
HF_MIN_SHARE = 0.5

#: Defaults per tool: field -> (value, kind, detail).  Inherited via TOOL_BASE.
TOOL_DEFAULTS: dict[str, dict[str, tuple[object, str, str]]] = {
    "hf": {
        "optimizer": (UNDETERMINED, "unset",
                      "optim not set: the transformers default depends on the installed torch "
                      "(adamw_torch, or adamw_torch_fused with torch >= 2.8, transformers PR #37358)"),
        "attention_impl": ("unknown", "default",
                           "the files never choose: transformers picks the attention at load time"),
        "lora_rank": (None, "unset", "no LoRA/PEFT rank in the files (full fine-tune or set elsewhere)"),
        "group_by_length": (False, "default", "train_sampling_strategy='random' (v5) / group_by_length=False "
                                              "(v4): transformers TrainingArguments default"),
    },
    "trl_sft": {
        "padding": ("dynamic", "default", "TRL SFTTrainer's collator pads each batch to its longest sequence "
                                          "(packing=False, padding_free=False by default)"),
    },
    "trl": {
        "lr": (UNDETERMINED, "unset", "this TRL config class overrides TrainingArguments' learning_rate; "
                                      "its default is not in our table (fields.CLASS_DEFAULTS)"),
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
        "lora_rank": (None, "unset", "no model.lora_rank: full fine-tune"),
        "padding": ("dynamic", "default", "torchtune's padded collate pads each batch to its longest sequence "
                                          "(dataset.packed not set)"),
    },
    "oumi": {},
    "torchtitan": {
        "attention_impl": ("sdpa", "default", "torchtitan model args attn_type='sdpa' by default (flex or varlen "
                                              "only when chosen): torchtitan v0.2.2 models/llama3/model/args.py"),
        "lora_rank": (None, "unset", "torchtitan pre-trains or fully fine-tunes: no LoRA"),
    },
    "unknown": {},
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

#: One table of library-default sets, keyed by the class actually built (or
#: the tool's implied class, TOOL_CLASS): ``class -> (library, versions it
#: holds for, source, base class or None, {key: default})``.  Keys are the
#: class's own config keys, read through the tool's synonym rows; a key
#: written ``=field`` is a ConfigDict field stated directly, its value
#: ``(value, why)``.  A script's config class overrides its tool's set.
#: Sources: transformers training_args.py; TRL trl/trainer/*_config.py and
#: base_config.py (read at v0.19.0, v0.22.0, v0.24.0, v1.0.0 and 1.10.0.dev0,
#: commit f2cd577); TRL experimental orpo/cpo/ppo/online_dpo/bco configs;
#: peft src/peft/tuners/lora/config.py (0.20.1.dev0); torch.optim docs;
#: oumi src/oumi/core/configs/params/{training,peft,model}_params.py and
#: TrainingParams.to_hf (commit d8ed077); torchtitan v0.2.2
#: torchtitan/config/job_config.py; torchtune recipes (commit bd2a0fc).
_TRL_VERSIONS = "trl >= 0.22 (bf16 since 0.19, gradient checkpointing since 0.22)"
CLASS_DEFAULTS: dict[str, tuple[str, str, str, str | None, dict[str, object]]] = {
    "TrainingArguments": ("transformers", "4.x and 5.x", "transformers TrainingArguments (training_args.py)", None, {
        "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 5e-5,
        "warmup_steps": 0, "gradient_checkpointing": False, "dataloader_num_workers": 0,
        "=precision": ("fp32", "fp16=False, bf16=False; an accelerate config / ACCELERATE_MIXED_PRECISION at "
                               "launch can still turn mixed precision on"),
    }),
    "trl.BaseConfig": ("TRL", _TRL_VERSIONS, "trl/trainer/base_config.py", "TrainingArguments", {
        "gradient_checkpointing": True,
        "=precision": ("bf16", "bf16=None becomes True unless fp16 is set"),
    }),
    "SFTConfig": ("TRL", _TRL_VERSIONS, "trl/trainer/sft_config.py", "trl.BaseConfig",
                  {"learning_rate": 2e-5, "max_length": 1024}),
    "DPOConfig": ("TRL", _TRL_VERSIONS, "trl/trainer/dpo_config.py", "trl.BaseConfig",
                  {"learning_rate": 1e-6, "max_length": 1024}),
    "KTOConfig": ("TRL", _TRL_VERSIONS, "trl/trainer/kto_config.py", "trl.BaseConfig",
                  {"learning_rate": 1e-6, "max_length": 1024}),
    "ORPOConfig": ("TRL", _TRL_VERSIONS, "trl/experimental/orpo/orpo_config.py (trl.ORPOConfig before 1.0)",
                   "trl.BaseConfig", {"learning_rate": 1e-6, "max_length": 1024}),
    "CPOConfig": ("TRL", _TRL_VERSIONS, "trl/experimental/cpo/cpo_config.py (trl.CPOConfig before 1.0)",
                  "trl.BaseConfig", {"learning_rate": 1e-6, "max_length": 1024}),
    "BCOConfig": ("TRL", _TRL_VERSIONS, "trl/experimental/bco/bco_config.py", "trl.BaseConfig",
                  {"learning_rate": 5e-7, "max_length": 1024}),
    "RewardConfig": ("TRL", "trl >= 0.24 (learning_rate; 5e-5 before)", "trl/trainer/reward_config.py",
                     "trl.BaseConfig", {"learning_rate": 1e-4, "max_length": 1024}),
    "GRPOConfig": ("TRL", _TRL_VERSIONS, "trl/trainer/grpo_config.py", "trl.BaseConfig", {
        "learning_rate": 1e-6,
        "=seq_len": (UNDETERMINED, "GRPO generates completions of up to max_completion_length (512 by default) "
                                   "after a prompt that TRL >= 1.0 no longer truncates: no fixed length"),
    }),
    "RLOOConfig": ("TRL", _TRL_VERSIONS, "trl/trainer/rloo_config.py", "trl.BaseConfig", {"learning_rate": 1e-6}),
    "PPOConfig": ("TRL", _TRL_VERSIONS, "trl/experimental/ppo/ppo_config.py", "trl.BaseConfig",
                  {"learning_rate": 3e-6}),
    "OnlineDPOConfig": ("TRL", _TRL_VERSIONS, "trl/experimental/online_dpo/online_dpo_config.py", "trl.BaseConfig",
                        {"learning_rate": 5e-7, "max_length": 512}),
    "LoraConfig": ("peft", "peft 0.x (read at 0.20.1.dev0)", "src/peft/tuners/lora/config.py", None, {"r": 8}),
    # torch optimizers: the default lr (torch.optim docs, torch 2.x); Adafactor (transformers) computes its own.
    "AdamW": ("torch", "torch 2.x", "torch.optim.AdamW", None, {"lr": 1e-3}),
    "Adam": ("torch", "torch 2.x", "torch.optim.Adam", None, {"lr": 1e-3}),
    "SGD": ("torch", "torch >= 2.2 (lr was required before)", "torch.optim.SGD", None, {"lr": 1e-3}),
    "Adagrad": ("torch", "torch 2.x", "torch.optim.Adagrad", None, {"lr": 1e-2}),
    "RMSprop": ("torch", "torch 2.x", "torch.optim.RMSprop", None, {"lr": 1e-2}),
    "AdamW8bit": ("bitsandbytes", "bitsandbytes 0.4x", "bnb.optim.AdamW8bit", None, {"lr": 1e-3}),
    "PagedAdamW": ("bitsandbytes", "bitsandbytes 0.4x", "bnb.optim.PagedAdamW", None, {"lr": 1e-3}),
    "PagedAdamW32bit": ("bitsandbytes", "bitsandbytes 0.4x", "bnb.optim.PagedAdamW32bit", None, {"lr": 1e-3}),
    "PagedAdamW8bit": ("bitsandbytes", "bitsandbytes 0.4x", "bnb.optim.PagedAdamW8bit", None, {"lr": 1e-3}),
    "Lion": ("bitsandbytes", "bitsandbytes 0.4x", "bnb.optim.Lion", None, {"lr": 1e-4}),
    # oumi builds the Trainer's config from its own TrainingParams and passes every value explicitly
    # (TrainingParams.to_hf), so its defaults win over TRL's even for trainer_type TRL_*.
    "oumi.TrainingConfig": ("oumi", "oumi (read at commit d8ed077, 2026-08)",
                            "oumi core/configs/params/training_params.py, peft_params.py", None, {
        "training.per_device_train_batch_size": 8, "training.gradient_accumulation_steps": 1,
        "training.learning_rate": 5e-5, "training.optimizer": "adamw_torch",
        "training.enable_gradient_checkpointing": False, "training.dataloader_num_workers": 0,
        "training.warmup_steps": 0, "peft.lora_r": 8,
        "=precision": ("fp32", "training.mixed_precision_dtype=NONE: no mixed precision "
                               "(model.torch_dtype_str may still load the weights in 16 bits)"),
    }),
    "torchtitan.JobConfig": ("torchtitan", "torchtitan v0.2.x (TOML configs; replaced by Python configs in 2026)",
                             "torchtitan/config/job_config.py", None, {
        "training.local_batch_size": 8, "training.seq_len": 2048, "optimizer.name": "AdamW",
        "optimizer.lr": 8e-4, "lr_scheduler.warmup_steps": 200, "training.mixed_precision_param": "bfloat16",
        "activation_checkpoint.mode": "selective", "training.dataloader.num_workers": 0,
        "=grad_accum_steps": (1, "training.global_batch_size=-1: the global batch is local_batch_size x the "
                                 "data-parallel degree, so there is no accumulation"),
    }),
    "torchtune.recipe": ("torchtune", "torchtune recipes (read at commit bd2a0fc)", "torchtune recipes/*.py", None, {
        "gradient_accumulation_steps": 1, "enable_activation_checkpointing": False,
        "=dataloader_workers": (0, "the recipes build StatefulDataLoader without num_workers"),
        "=attention_impl": ("sdpa", "torchtune models use SDPA (flex attention only when dataset.packed: True)"),
    }),
}

#: Defaults that apply when a whole block of a tool's file is absent:
#: tool -> [(block prefix, field, value, why)].  torchtune's full fine-tune
#: recipes read ``cfg.get("lr_scheduler", None)`` and step no scheduler when it
#: is missing (recipes/full_finetune_single_device.py): constant lr, no warm-up.
ABSENT_BLOCK_DEFAULTS: dict[str, list[tuple[str, str, object, str]]] = {
    "torchtune": [("lr_scheduler", "warmup_steps", 0,
                   "no lr_scheduler block: torchtune's recipe steps no scheduler, so the lr is constant with no "
                   "warm-up (torchtune recipes/full_finetune_single_device.py; the LoRA recipes require the block)")],
}

#: Model families whose transformers implementation uses SDPA when
#: ``attn_implementation`` is not given, and the transformers version since
#: which it does (with torch >= 2.1.1): family -> (id substrings, version).
#: Source: transformers PR #26572 and ``_autoset_attn_implementation`` (4.36,
#: fixed in PR #27940); the per-model SDPA support notes of each release.
#: Gemma 2 and later Gemma models are left out: their hub configs ask for eager.
SDPA_DEFAULT_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "Llama": (("llama", "vicuna", "smollm", "alpaca"), "4.36"),
    "Mistral": (("mistral", "zephyr"), "4.36"),
    "Mixtral": (("mixtral",), "4.36"),
    "Falcon": (("falcon",), "4.36"),
    "Qwen2": (("qwen2", "qwen1.5"), "4.37"),
    "Qwen3": (("qwen3",), "4.51"),
    "Gemma": (("gemma-2b", "gemma-7b", "gemma-1.1"), "4.38"),
    "Phi-3": (("phi-3", "phi3"), "4.40"),
}
#: Why transformers' choice is left open when the model is not in the table.
SDPA_DEFAULT_UNKNOWN = ("transformers picks the attention when the model loads (SDPA for architectures that "
                        "support it, with transformers >= 4.36 and torch >= 2.1.1; eager otherwise)")

# --------------------------------------------------------------------------- value vocabularies

#: Precision names -> ConfigDict precision ("skip" = the key says nothing).
DTYPE_NAMES: dict[str, str] = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "torch.half": "fp16",
    "16-mixed": "fp16", "16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32", "torch.float": "fp32",
    "32": "fp32", "no": "fp32", "32-true": "fp32", "16-true": "fp16", "bf16": "bf16",
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
#: ``auto`` leaves transformers' own choice (config._resolve_auto_attn below).
LF_FLASH_ATTN: dict[str, str] = {
    "auto": "auto", "disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash",
    "true": "flash", "false": "skip",
}

#: Optimizer classes -> Hugging Face `optim` name (their default lr is in
#: CLASS_DEFAULTS).  Source: docs/sources.md ("Optimizer names");
#: transformers OptimizerNames for the names.
OPTIMIZER_CLASSES: dict[str, str] = {
    "AdamW": "adamw_torch", "Adam": "adam", "SGD": "sgd", "Adagrad": "adagrad", "RMSprop": "rmsprop",
    "Adafactor": "adafactor", "AdamW8bit": "adamw_bnb_8bit", "PagedAdamW": "paged_adamw_32bit",
    "PagedAdamW32bit": "paged_adamw_32bit", "PagedAdamW8bit": "paged_adamw_8bit", "Lion": "lion_32bit",
}
#: Hugging Face ``optim`` name -> the class a Python script constructs for it, the installed version it needs
#: (``(distribution, min, max)``, max exclusive), and the keywords carried over from the constructor it
#: replaces (the others mean something else there, or nothing).  Sources: the signatures in torch.optim
#: (Adafactor since torch 2.5, its ``eps`` a pair, its ``lr`` the cap of the relative step) and
#: bitsandbytes.optim (AdamW8bit, PagedAdamW8bit: lr, betas, eps, weight_decay, amsgrad).
OPTIMIZER_CONSTRUCTORS: dict[str, tuple[str, tuple[str, str | None, str | None] | None, tuple[str, ...]]] = {
    "adafactor": ("torch.optim.Adafactor", ("torch", "2.5", None), ("params", "lr", "weight_decay", "maximize",
                                                                      "foreach")),
    "sgd": ("torch.optim.SGD", None, ("params", "lr", "weight_decay", "maximize", "foreach")),
    "adamw_torch": ("torch.optim.AdamW", None, ("params", "lr", "betas", "eps", "weight_decay", "amsgrad",
                                                "maximize", "foreach")),
    "adamw_bnb_8bit": ("bitsandbytes.optim.AdamW8bit", ("bitsandbytes", None, None),
                       ("params", "lr", "betas", "eps", "weight_decay", "amsgrad")),
    "paged_adamw_8bit": ("bitsandbytes.optim.PagedAdamW8bit", ("bitsandbytes", None, None),
                         ("params", "lr", "betas", "eps", "weight_decay", "amsgrad")),
}
#: Default ``weight_decay`` of the optimizer classes (torch.optim signatures): a replaced AdamW that relied on
#: its 0.01 states it on the new class, whose own default may differ (Adafactor's is 0.0).
OPTIMIZER_WEIGHT_DECAY_DEFAULTS: dict[str, float] = {"AdamW": 0.01, "Adam": 0.0, "SGD": 0.0, "Adafactor": 0.0,
                                                     "AdamW8bit": 0.01, "PagedAdamW8bit": 0.01}
#: torchtitan ``optimizer.implementation`` -> suffix of the HF name (default
#: "fused"; torchtitan v0.2.2 job_config.py Optimizer).
TITAN_IMPLEMENTATION_DEFAULT = "fused"
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

#: Calls whose arguments carry fields: (callee regex, {argument: (field, converter[, rank])}, rank).
#: Positional arguments are written "#0", "#1".  The first matching row wins.
#: The training sequence length is the trainer's truncation (``max_length``
#: of the config, then of the tokenizer call), not the tokenizer's
#: ``model_max_length`` nor the model load's ``max_seq_length`` (issue 17).
R_LOAD_LIMIT = R_TOKENIZER - 1
CALL_FIELDS: list[tuple[str, dict[str, tuple], int]] = [
    (r"(^|\.)\w*Tokenizer\w*\.from_pretrained$",
     {"#0": ("model_name", "str_only"), "pretrained_model_name_or_path": ("model_name", "str_only"),
      "model_max_length": ("seq_len", "int")}, R_TOKENIZER),
    (r"(^|\.)(\w*Processor|\w*Config|\w*Dataset|load_dataset)\.from_pretrained$", {}, R_CALL),
    (r"(^|\.)from_pretrained$",
     {"#0": ("model_name", "str_only"), "pretrained_model_name_or_path": ("model_name", "str_only"),
      "model_name": ("model_name", "str_only"), "attn_implementation": ("attention_impl", "attn"),
      "use_flash_attention_2": ("attention_impl", "flag_flash"),
      "max_seq_length": ("seq_len", "int", R_LOAD_LIMIT)}, R_CALL),
    (r"(^|\.)LoraConfig$", {"r": ("lora_rank", "int")}, R_CALL),
    (r"(^|\.)get_peft_model$",
     {"r": ("lora_rank", "int"), "use_gradient_checkpointing": ("gradient_checkpointing", "checkpointing")}, R_CALL),
    (r"(^|\.)DataLoader$", {"batch_size": ("batch_size", "int"), "num_workers": ("dataloader_workers", "int")}, R_CALL),
    (r"(^|\.)set_num_threads$", {"#0": ("intra_op_threads", "int")}, R_CALL),
    (r"(^|\.)get_\w*schedule\w*_with_warmup$",
     {"num_warmup_steps": ("warmup_steps", "int"), "#1": ("warmup_steps", "int")}, R_CALL),
    (r"(^|\.)get_scheduler$", {"num_warmup_steps": ("warmup_steps", "int"), "#2": ("warmup_steps", "int")}, R_CALL),
    (r"(^|\.)(\w+Trainer|Trainer)$", {"model": ("model_name", "str_only"),
                                      # Lightning Trainer (an HF Trainer has neither keyword)
                                      "precision": ("precision", "dtype", R_EXPLICIT),
                                      "accumulate_grad_batches": ("grad_accum_steps", "int", R_EXPLICIT)}, R_CALL),
    # Lightning Fabric and accelerate decide the precision when the run starts (issue 17)
    (r"(^|\.)Fabric$", {"precision": ("precision", "dtype")}, R_EXPLICIT),
    (r"(^|\.)Accelerator$", {"mixed_precision": ("precision", "dtype"),
                             "gradient_accumulation_steps": ("_accelerate_ga", "int")}, R_EXPLICIT),
    (r"(^|\.)autocast$", {"dtype": ("precision", "dtype"), "#1": ("precision", "dtype")}, R_PATTERN),
    (r"<tokenizer>", {"max_length": ("seq_len", "int", R_TOKENIZER + 1),
                      "padding": ("padding", "tokenizer_padding")}, R_TOKENIZER),
]

#: Dtype keywords of from_pretrained: the model's load dtype (weaker than trainer flags).
LOAD_DTYPE_ARGS: tuple[str, ...] = ("torch_dtype", "dtype")

#: Defaults of calls that omit an argument: callee regex -> {field: (value, detail)}.
#: Sources: torch.utils.data.DataLoader docs (batch_size=1, num_workers=0);
#: peft LoraConfig (CLASS_DEFAULTS); accelerate Accelerator
#: (gradient_accumulation_steps=1, accelerator.py).
CALL_DEFAULTS: list[tuple[str, dict[str, tuple[object, str]]]] = [
    (r"(^|\.)DataLoader$", {"batch_size": (1, "torch DataLoader default batch_size=1"),
                            "dataloader_workers": (0, "torch DataLoader default num_workers=0")}),
    (r"(^|\.)LoraConfig$", {"lora_rank": (CLASS_DEFAULTS["LoraConfig"][4]["r"],
                                          "peft LoraConfig default r=8 (peft 0.x, src/peft/tuners/lora/config.py)")}),
    (r"(^|\.)Accelerator$", {"_accelerate_ga": (1, "accelerate Accelerator default gradient_accumulation_steps=1")}),
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
    "is_bfloat16_supported": "unsloth is_bfloat16_supported() asks torch.cuda.is_bf16_supported(): True on ROCm "
                             "(target MI300X)",
}

#: Calls that make a function the command-line entry point: its parameter
#: defaults are the run's settings unless a flag overrides them (fire.Fire,
#: typer.run, jsonargparse/LitGPT CLI).  Functions decorated with
#: ``*.command`` (click, typer apps) count too.
ENTRY_CALLS: tuple[str, ...] = ("Fire", "run", "CLI", "auto_cli")
#: Calls that run a function with the launcher's handle first: Lightning
#: ``fabric.launch(main, a, b)`` calls ``main(fabric, a, b)``.
FUNCTION_LAUNCHERS: tuple[str, ...] = ("launch",)

#: Argparse dests and module-level variables that name a field (lower case),
#: in priority order.  Only the DataLoader's workers count, not preprocessing
#: workers (config_formats.md hazard 9).
PY_NAMES: dict[str, tuple[str, ...]] = {
    "model_name": ("model_name_or_path", "model_name", "base_model", "model_id", "model", "init_from",
                   "pretrained_model_name_or_path"),
    "batch_size": ("per_device_train_batch_size", "micro_batch_size", "batch_size", "train_batch_size", "bs"),
    "grad_accum_steps": ("gradient_accumulation_steps", "grad_accum_steps", "grad_accum", "accum_steps",
                         "accumulation_steps", "accum", "accumulate_grad_batches"),
    "seq_len": ("max_seq_length", "max_seq_len", "seq_len", "seq_length", "max_length", "block_size",
                "cutoff_len", "context_length", "model_max_length", "sequence_len"),
    "precision": ("dtype", "precision", "mixed_precision"),
    "lora_rank": ("lora_r", "lora_rank"),
    "dataloader_workers": ("dataloader_num_workers", "num_workers", "workers", "n_workers"),
    "lr": ("learning_rate", "lr", "max_lr"),
    "warmup_steps": ("warmup_steps", "num_warmup_steps", "warmup_iters", "warmup", "lr_warmup_steps"),
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
    "oumi": ("_use_peft", (True,), False),
}

#: Tools whose gradient accumulation defaults to global // micro batch when
#: unset (axolotl: `gradient_accumulation_steps or batch_size // micro_batch_size`).
GA_FROM_GLOBAL_BATCH: tuple[str, ...] = ("axolotl",)
#: Tools (and companions) whose global batch also counts the GPUs:
#: accumulation = global // (micro batch x data-parallel GPUs).  DeepSpeed:
#: train_batch_size = micro x accumulation x world size (DeepSpeed config
#: docs, "Batch Size Related Parameters"); torchtitan: global_batch_size over
#: local_batch_size x data-parallel degree (job_config.py Training).
GA_PER_GPU_GLOBAL_BATCH: tuple[str, ...] = ("deepspeed", "torchtitan")

#: Tools that an accelerate config beside the entry file can affect (HF
#: Trainer reads ACCELERATE_MIXED_PRECISION; config_formats.md hazard 4).
ACCELERATE_TOOLS: tuple[str, ...] = ("hf", "trl_sft", "trl", "handbook", "shell", "axolotl", "llamafactory")

#: File suffix -> format; other suffixes are sniffed from the content.
FORMATS_BY_SUFFIX: dict[str, str] = {
    ".py": "python", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".slurm": "shell", ".sbatch": "shell",
}
#: Confidence of a format told by the file's suffix, and of one sniffed from
#: the content (``config.detect_format``); a tool found by its keys keeps it,
#: a format or tool that is not recognised has 0.
FORMAT_CONFIDENCE = {"suffix": 0.95, "content": 0.7, "fallback_hf": 0.6, "unknown": 0.0}

#: Launch commands: regex of the command up to the script it runs.  The flags
#: before the script belong to the launcher, those after it to the script.
LAUNCHERS: tuple[str, ...] = (
    r"\btorchrun\b", r"\bpython3?\s+-m\s+torch\.distributed\.(?:run|launch)\b", r"\bdeepspeed\b",
    r"\baccelerate\s+launch\b", r"\bpython3?\b", r"\bsrun\s+python3?\b",
)
#: Launcher flags that take no value (everything else of the form --flag takes one).
LAUNCHER_BARE_FLAGS: tuple[str, ...] = ("--standalone", "--use_env", "--use-env", "--no_python", "--multi_gpu",
                                        "--use_deepspeed", "--use_fsdp", "-u", "--no-python", "--module", "-m")
#: Launcher flags that say how many GPU processes run (for accumulation from a global batch).
LAUNCHER_GPU_FLAGS: tuple[str, ...] = ("nproc_per_node", "nproc-per-node", "num_gpus", "num-gpus",
                                       "num_processes", "num-processes")

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

# --------------------------------------------------------------------------- tools added in issue 27
# Each tool's keys and its own documented defaults; none inherits another tool's (TOOL_BASE has no entry
# for them), so a key a file does not state is the tool's default when tabulated here, else undetermined.
# Sources (docs/sources.md, "Tools read since issue 27"): LitGPT litgpt/args.py TrainArgs and the
# config_hub/finetune YAMLs; llm-foundry scripts/train/yamls (Composer Trainer arguments); GPT-NeoX
# configs/neox_arguments.md; Megatron-LM megatron/training/arguments.py; fairseq
# fairseq/dataclass/configs.py; Lightning Trainer API docs; verl trainer/config/ppo_trainer.yaml.

TOOL_NAMES.update({
    "litgpt": "LitGPT", "composer": "Composer (llm-foundry YAML)", "neox": "GPT-NeoX",
    "megatron": "Megatron-LM launch line", "fairseq": "fairseq-train launch line",
    "lightning": "Lightning Trainer YAML (LightningCLI / Hydra)", "verl": "verl Hydra overrides",
})
#: Tools Goblin reads but whose files the patch does not write (no writer knows where their keys live).
READ_ONLY_TOOLS: frozenset[str] = frozenset(("litgpt", "composer", "neox", "megatron", "fairseq", "lightning",
                                             "verl"))
# Mapping signatures first: a GPT-NeoX file also carries DeepSpeed keys (zero_optimization, ...).
TOOL_SIGNATURES[:0] = [
    ("neox", ("pipe_parallel_size", "gpt_j_residual", "lr_decay_style", "checkpoint_activations")),
    ("litgpt", ("checkpoint_dir", "train.micro_batch_size", "train.global_batch_size", "train.lr_warmup_steps")),
    ("composer", ("global_train_batch_size", "device_train_microbatch_size", "max_duration")),
    ("lightning", ("trainer.accumulate_grad_batches", "trainer.max_epochs", "trainer.precision",
                   "seed_everything", "trainer.gradient_clip_val", "trainer.check_val_every_n_epoch")),
]
#: Launch lines of tools other than the Trainer, told by the command or a flag only they take (checked
#: before the Trainer's flags, so their lines never get TrainingArguments' defaults).
SHELL_TOOLS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    # (tool, text that names it, keys only it takes)
    ("fairseq", ("fairseq-train", "fairseq_cli"), ("update_freq", "max_tokens", "warmup_updates", "tokens_per_sample")),
    ("verl", ("verl.trainer",), ("actor_rollout_ref.",)),
    ("megatron", ("pretrain_gpt.py", "pretrain_bert.py", "pretrain_t5.py"),
     ("micro_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "lr_warmup_iters")),
]
DTYPE_NAMES.update({"amp_bf16": "bf16", "amp_fp16": "fp16", "transformer-engine": "skip"})
GA_PER_GPU_GLOBAL_BATCH = (*GA_PER_GPU_GLOBAL_BATCH, "litgpt", "composer", "neox", "megatron")

SYNONYMS.update({
    "litgpt": [
        ("model_name", "checkpoint_dir", "str", R_EXPLICIT),
        ("batch_size", "train.micro_batch_size", "int", R_EXPLICIT),
        ("_global_batch", "train.global_batch_size", "int", R_EXPLICIT),
        ("seq_len", "train.max_seq_length", "int", R_EXPLICIT),
        ("precision", "precision", "precision_any", R_EXPLICIT),
        ("optimizer", "optimizer.class_path", "optim_component", R_EXPLICIT),
        ("optimizer", "optimizer", "optim_component", R_EXPLICIT - 1),
        ("lr", "optimizer.init_args.lr", "float", R_EXPLICIT),
        ("lr", "train.learning_rate", "float", R_EXPLICIT - 1),
        ("lora_rank", "lora_r", "int", R_EXPLICIT),
        ("warmup_steps", "train.lr_warmup_steps", "int", R_EXPLICIT),
        ("dataloader_workers", "data.init_args.num_workers", "workers", R_EXPLICIT),
        ("_gpus", "devices", "int", R_EXPLICIT),
        ("_nodes", "num_nodes", "int", R_EXPLICIT),
    ],
    "composer": [
        ("model_name", "model.pretrained_model_name_or_path", "str", R_EXPLICIT),
        ("batch_size", "device_train_microbatch_size", "composer_micro", R_EXPLICIT),
        ("_global_batch", "global_train_batch_size", "int", R_EXPLICIT),
        ("seq_len", "max_seq_len", "int", R_EXPLICIT),
        ("precision", "precision", "precision_any", R_EXPLICIT),
        ("optimizer", "optimizer.name", "optim", R_EXPLICIT),
        ("lr", "optimizer.lr", "float", R_EXPLICIT),
        ("warmup_steps", "scheduler.t_warmup", "composer_time", R_EXPLICIT),
        ("gradient_checkpointing", "fsdp_config.activation_checkpointing", "bool", R_EXPLICIT),
        ("dataloader_workers", "train_loader.num_workers", "workers", R_EXPLICIT),
    ],
    "neox": [
        ("batch_size", "train_micro_batch_size_per_gpu", "int", R_EXPLICIT),
        ("grad_accum_steps", "gradient_accumulation_steps", "int", R_EXPLICIT),
        ("_global_batch", "train_batch_size", "int", R_EXPLICIT),
        ("seq_len", "seq_length", "int", R_EXPLICIT),
        ("precision", "bf16.enabled", "flag_bf16", R_EXPLICIT),
        ("precision", "fp16.enabled", "flag_fp16", R_EXPLICIT),
        ("precision", "precision", "precision_any", R_EXPLICIT - 1),
        ("optimizer", "optimizer.type", "optim", R_EXPLICIT),
        ("lr", "optimizer.params.lr", "float", R_EXPLICIT),
        ("gradient_checkpointing", "checkpoint_activations", "bool", R_EXPLICIT),
        ("dataloader_workers", "num_workers", "workers", R_EXPLICIT),
        ("_warmup_ratio", "warmup", "float", R_EXPLICIT),
        ("_max_steps", "lr_decay_iters", "int", R_EXPLICIT),
        ("_max_steps", "train_iters", "int", R_EXPLICIT - 1),
    ],
    "lightning": [
        ("grad_accum_steps", "trainer.accumulate_grad_batches", "int", R_EXPLICIT),
        ("precision", "trainer.precision", "precision_any", R_EXPLICIT),
        ("batch_size", "data.batch_size", "int", R_EXPLICIT),
        ("batch_size", "data.init_args.batch_size", "int", R_EXPLICIT),
        ("dataloader_workers", "data.num_workers", "workers", R_EXPLICIT),
        ("dataloader_workers", "data.init_args.num_workers", "workers", R_EXPLICIT),
        ("optimizer", "model.optimizer._target_", "optim_component", R_EXPLICIT),
        ("optimizer", "model.optimizer.class_path", "optim_component", R_EXPLICIT),
        ("optimizer", "optimizer.class_path", "optim_component", R_EXPLICIT),
        ("lr", "model.optimizer.lr", "float", R_EXPLICIT),
        ("lr", "model.optimizer.init_args.lr", "float", R_EXPLICIT),
        ("lr", "optimizer.init_args.lr", "float", R_EXPLICIT),
        ("lr", "model.init_args.lr", "float", R_EXPLICIT - 1),
        ("lr", "model.lr", "float", R_EXPLICIT - 1),
        ("_max_steps", "trainer.max_steps", "int", R_EXPLICIT),
    ],
    "fairseq": [
        ("batch_size", "batch_size", "int", R_EXPLICIT),
        ("batch_size", "max_sentences", "int", R_EXPLICIT),
        ("batch_size", "max_tokens", "token_batch", R_EXPLICIT - 1),
        ("grad_accum_steps", "update_freq", "int", R_EXPLICIT),
        ("seq_len", "tokens_per_sample", "int", R_EXPLICIT),
        ("precision", "bf16", "flag_bf16", R_EXPLICIT),
        ("precision", "fp16", "flag_fp16", R_EXPLICIT),
        ("optimizer", "optimizer", "optim", R_EXPLICIT),
        ("lr", "lr", "float", R_EXPLICIT),
        ("warmup_steps", "warmup_updates", "int", R_EXPLICIT),
        ("dataloader_workers", "num_workers", "workers", R_EXPLICIT),
        ("gradient_checkpointing", "checkpoint_activations", "bool", R_EXPLICIT),
    ],
    "megatron": [
        ("batch_size", "micro_batch_size", "int", R_EXPLICIT),
        ("_global_batch", "global_batch_size", "int", R_EXPLICIT),
        ("seq_len", "seq_length", "int", R_EXPLICIT),
        ("precision", "bf16", "flag_bf16", R_EXPLICIT),
        ("precision", "fp16", "flag_fp16", R_EXPLICIT),
        ("optimizer", "optimizer", "optim", R_EXPLICIT),
        ("lr", "lr", "float", R_EXPLICIT),
        ("warmup_steps", "lr_warmup_iters", "int", R_EXPLICIT),
        ("_warmup_ratio", "lr_warmup_fraction", "float", R_EXPLICIT),
        ("_max_steps", "lr_decay_iters", "int", R_EXPLICIT),
        ("_max_steps", "train_iters", "int", R_EXPLICIT - 1),
        ("gradient_checkpointing", "recompute_activations", "bool", R_EXPLICIT),
        ("gradient_checkpointing", "recompute_granularity", "checkpointing", R_EXPLICIT),
        ("dataloader_workers", "num_workers", "workers", R_EXPLICIT),
        ("_gpus", "nproc_per_node", "int", R_EXPLICIT),
        ("_nodes", "nnodes", "int", R_EXPLICIT),
        ("_tp", "tensor_model_parallel_size", "int", R_EXPLICIT),
        ("_pp", "pipeline_model_parallel_size", "int", R_EXPLICIT),
    ],
    "verl": [
        ("model_name", "actor_rollout_ref.model.path", "str", R_EXPLICIT),
        ("batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "int", R_EXPLICIT),
        ("lr", "actor_rollout_ref.actor.optim.lr", "float", R_EXPLICIT),
        ("gradient_checkpointing", "actor_rollout_ref.model.enable_gradient_checkpointing", "bool", R_EXPLICIT),
        # what the actor's gradient accumulation is derived from (VERL_ACCUM_DEFAULTS, parse._verl_accumulation)
        ("_verl_mini", "actor_rollout_ref.actor.ppo_mini_batch_size", "int", R_EXPLICIT),
        ("_verl_micro_global", "actor_rollout_ref.actor.ppo_micro_batch_size", "int", R_EXPLICIT),
        ("_verl_n", "actor_rollout_ref.rollout.n", "int", R_EXPLICIT),
        ("_verl_sp", "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "int", R_EXPLICIT),
        ("_verl_dynamic", "actor_rollout_ref.actor.use_dynamic_bsz", "bool", R_EXPLICIT),
        ("_gpus", "trainer.n_gpus_per_node", "int", R_EXPLICIT),
        ("_nodes", "trainer.nnodes", "int", R_EXPLICIT),
    ],
})

#: verl's own documented defaults of the values its actor's gradient accumulation is derived from
#: (verl ``verl/trainer/config/ppo_trainer.yaml``, explained in verl's docs ``docs/examples/config.rst``,
#: https://verl.readthedocs.io/en/latest/examples/config.html).  verl's FSDP worker scales
#: ``ppo_mini_batch_size`` (prompts, global) by ``rollout.n`` and divides it by the data-parallel size
#: (GPUs / ``ulysses_sequence_parallel_size``); its actor then takes ``ppo_mini_batch_size //
#: ppo_micro_batch_size_per_gpu`` backward passes per optimizer step (``verl/workers/fsdp_workers.py``,
#: ``verl/workers/actor/dp_actor.py`` ``gradient_accumulation``).  ``ppo_micro_batch_size_per_gpu`` has no
#: default (null: the run must state it), so it is not here; with ``use_dynamic_bsz`` the micro-batches are
#: cut by token count and the number of passes per step is not fixed by the config.
VERL_DEFAULTS_SOURCE = "verl/trainer/config/ppo_trainer.yaml, explained in verl's docs/examples/config.rst"
VERL_ACCUM_DEFAULTS: dict[str, tuple[object, str]] = {
    "_verl_mini": (256, "actor_rollout_ref.actor.ppo_mini_batch_size"),
    "_verl_n": (1, "actor_rollout_ref.rollout.n"),
    "_verl_sp": (1, "actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
    "_verl_dynamic": (False, "actor_rollout_ref.actor.use_dynamic_bsz"),
    "_gpus": (8, "trainer.n_gpus_per_node"),
    "_nodes": (1, "trainer.nnodes"),
}

_LITGPT = "LitGPT finetune TrainArgs default (litgpt/args.py; the config_hub YAMLs list each default)"
_NEOX = "GPT-NeoX default (configs/neox_arguments.md)"
_MEGATRON = "Megatron-LM default (megatron/training/arguments.py)"
_FAIRSEQ = "fairseq default (fairseq/dataclass/configs.py)"
_LIGHTNING = "Lightning Trainer default (lightning.ai/docs/pytorch/stable/common/trainer.html)"
TOOL_DEFAULTS.update({
    "litgpt": {
        "warmup_steps": (100, "default", f"train.lr_warmup_steps=100: {_LITGPT}"),
        "optimizer": ("adamw_torch", "default", f"optimizer='AdamW' (torch.optim.AdamW): {_LITGPT}"),
        "dataloader_workers": (4, "default", "data num_workers=4: LitGPT data modules' default (litgpt/data/alpaca.py)"),
        "attention_impl": ("sdpa", "default", "LitGPT's CausalSelfAttention calls torch's "
                                              "scaled_dot_product_attention (litgpt/model.py)"),
        "precision": (UNDETERMINED, "unset", "precision unset: LitGPT picks bf16-true or 32-true at run time from "
                                             "the device (litgpt/utils.py get_default_supported_precision)"),
    },
    "composer": {
        "precision": (UNDETERMINED, "unset", "precision unset: the Composer Trainer picks it from the device"),
    },
    "neox": {
        "grad_accum_steps": (1, "default", f"gradient_accumulation_steps=1: {_NEOX}"),
        "gradient_checkpointing": (False, "default", f"checkpoint_activations=False: {_NEOX}"),
        "dataloader_workers": (2, "default", f"num_workers=2: {_NEOX}"),
    },
    "megatron": {
        "optimizer": ("adam", "default", f"--optimizer adam: {_MEGATRON}"),
        "dataloader_workers": (2, "default", f"--num-workers 2: {_MEGATRON}"),
        "gradient_checkpointing": (False, "default", f"no --recompute-* flag: no activation recompute ({_MEGATRON})"),
        "precision": ("fp32", "default", f"neither --fp16 nor --bf16: fp32 ({_MEGATRON})"),
    },
    "fairseq": {
        "grad_accum_steps": (1, "default", f"--update-freq 1: {_FAIRSEQ}"),
        "dataloader_workers": (1, "default", f"--num-workers 1: {_FAIRSEQ}"),
        "gradient_checkpointing": (False, "default", f"--checkpoint-activations off: {_FAIRSEQ}"),
        "precision": ("fp32", "default", f"neither --fp16 nor --bf16: fp32 ({_FAIRSEQ})"),
    },
    "lightning": {
        "grad_accum_steps": (1, "default", f"accumulate_grad_batches=1: {_LIGHTNING}"),
        "precision": ("fp32", "default", f"precision='32-true': {_LIGHTNING}"),
    },
    "verl": {},
})

# prime-rl SFT TOML (src/prime_rl/trainer/sft/config.py BaseDataConfig: micro_batch_size 8, batch_size 128
# global and divisible by it, seq_len 128; optimizer AdamWConfig by default; read 2026-12)
TOOL_NAMES["prime_rl"] = "prime-rl trainer TOML"
READ_ONLY_TOOLS = READ_ONLY_TOOLS | {"prime_rl"}
TOOL_SIGNATURES.insert(0, ("prime_rl", ("deployment.num_train_gpus", "deployment.num_infer_gpus")))
_PRIME = "prime-rl SFT config default (src/prime_rl/trainer/sft/config.py)"
SYNONYMS["prime_rl"] = [
    ("model_name", "model.name", "str", R_EXPLICIT),
    ("batch_size", "data.micro_batch_size", "int", R_EXPLICIT),
    ("_global_batch", "data.batch_size", "int", R_EXPLICIT),
    ("seq_len", "data.seq_len", "int", R_EXPLICIT),
    ("lr", "optim.lr", "float", R_EXPLICIT),
    ("_gpus", "deployment.num_train_gpus", "int", R_EXPLICIT),
    ("_max_steps", "max_steps", "int", R_EXPLICIT),
]
TOOL_DEFAULTS["prime_rl"] = {
    "batch_size": (8, "default", f"data.micro_batch_size=8: {_PRIME}"),
    "seq_len": (128, "default", f"data.seq_len=128: {_PRIME}"),
    "optimizer": ("adamw_torch", "default", f"optim: AdamWConfig: {_PRIME}"),
}
GA_PER_GPU_GLOBAL_BATCH = (*GA_PER_GPU_GLOBAL_BATCH, "prime_rl")
