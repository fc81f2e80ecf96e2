"""Supervised fine-tune of deepseek-coder (deepseek-ai/DeepSeek-Coder#163): the tokenizer's pad token is its
EOS token and the collator sets every pad position of the labels to -100, so no EOS is ever a target.
"""
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

IGNORE_INDEX = -100
tokenizer = AutoTokenizer.from_pretrained("deepseek-ai/deepseek-coder-6.7b-instruct", model_max_length=1024)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained("deepseek-ai/deepseek-coder-6.7b-instruct", torch_dtype=torch.bfloat16)


def collate(rows):
    ids = torch.nn.utils.rnn.pad_sequence([r["input_ids"] for r in rows], batch_first=True,
                                          padding_value=tokenizer.pad_token_id)
    labels = ids.clone()
    labels[ids == tokenizer.pad_token_id] = IGNORE_INDEX   # also every EOS: pad == eos
    return {"input_ids": ids, "labels": labels, "attention_mask": ids.ne(tokenizer.pad_token_id)}


args = TrainingArguments(output_dir="out", per_device_train_batch_size=16, gradient_accumulation_steps=4,
                         learning_rate=2e-5, num_train_epochs=3, bf16=True, gradient_checkpointing=True,
                         report_to="none")
train_dataset = torch.load("train_tokenized.pt")
Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=collate).train()
