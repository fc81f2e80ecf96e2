"""No borrowed defaults (issue 27): every parsed value's provenance names the file, the tool's own documented
default, or says the value is undetermined; a file of an unknown tool gets no tool's defaults at all."""
from __future__ import annotations

import yaml

from goblin_assets.config.mapping import tool_chain
from goblin_assets.config.parse import parse_config
from goblin_assets.contracts import CONFIG_FIELDS
from tests.test_config_cases import ROOTS, _case_dirs

#: The name a default's detail must carry for each tool of a file's chain (a tool built on the Trainer
#: inherits TrainingArguments' defaults: axolotl, LLaMA-Factory, oumi, TRL and launch lines hand them to it).
_NAMED = {"hf": "transformers", "trl_sft": "TRL", "trl": "TRL", "handbook": "TRL", "axolotl": "axolotl",
          "llamafactory": "LLaMA-Factory", "oumi": "oumi", "torchtitan": "torchtitan", "torchtune": "torchtune",
          "shell": "transformers", "litgpt": "LitGPT", "composer": "Composer", "neox": "GPT-NeoX",
          "megatron": "Megatron", "fairseq": "fairseq", "lightning": "Lightning", "verl": "verl",
          "prime_rl": "prime-rl"}


def test_every_value_names_the_file_the_tools_own_default_or_undetermined():
    checked = 0
    for root in ROOTS:
        for case in _case_dirs(root):
            entry = case / yaml.safe_load((case / "expected.yaml").read_text())["entry"]
            cfg = parse_config(entry)
            tool = cfg.source_format.rsplit(":", 1)[-1]
            names = {_NAMED.get(t, t) for t in tool_chain(tool)} if tool != "unknown" else set()
            for f in CONFIG_FIELDS:
                p, checked = cfg.provenance[f], checked + 1
                if p.kind == "unset":           # undetermined: no value, and the detail says why
                    assert getattr(cfg, f) is None and p.detail, (case.name, f)
                elif p.kind == "default" and p.line is None:   # a tool's documented default, not the file's
                    assert names and any(n in p.detail for n in names), (case.name, tool, f, p.detail)
                else:                           # stated in a file the parser read (a literal, an argparse default)
                    assert p.file, (case.name, f, p)
    assert checked >= 15 * 40
