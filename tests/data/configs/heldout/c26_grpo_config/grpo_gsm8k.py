"""GRPO on grade-school maths: one reward for the answer, one for the format."""
import re

from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer

dataset = load_dataset("openai/gsm8k", "main", split="train")


def answer_reward(completions, answer, **kwargs):
    found = [re.search(r"####\s*(-?\d+)", c) for c in completions]
    return [1.0 if m and m.group(1) == a.split("####")[-1].strip() else 0.0 for m, a in zip(found, answer)]


def format_reward(completions, **kwargs):
    return [0.5 if "<think>" in c and "</think>" in c else 0.0 for c in completions]


config = GRPOConfig(
    output_dir="qwen-grpo-gsm8k",
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=256,
    logging_steps=5,
    report_to="none",
)

trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=[answer_reward, format_reward],
    args=config,
    train_dataset=dataset,
)
trainer.train()
