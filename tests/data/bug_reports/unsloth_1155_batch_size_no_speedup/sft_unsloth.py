"""Unsloth SFT of Llama-3.2-1B on an RTX 4090D (unslothai/unsloth#1155): 100 optimizer steps of 16 samples
take 70 s with micro-batch 2, 70 s with 4 and 75 s with 1, so larger micro-batches buy nothing; the
maintainer points at the padding of the random batches and suggests group_by_length=True.
"""
from datasets import load_dataset
from transformers import TrainingArguments
from trl import SFTTrainer
from unsloth import FastLanguageModel

max_seq_length = 2048
model, tokenizer = FastLanguageModel.from_pretrained(model_name="unsloth/Llama-3.2-1B-Instruct",
                                                     max_seq_length=max_seq_length, dtype=None, load_in_4bit=False)
model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0,
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"],
                                         use_gradient_checkpointing="unsloth")

dataset = load_dataset("json", data_files="sft.jsonl", split="train")

trainer = SFTTrainer(
    model=model,
    tokenizer=tokenizer,
    train_dataset=dataset,
    dataset_text_field="text",
    max_seq_length=max_seq_length,
    packing=False,
    args=TrainingArguments(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        max_steps=100,
        learning_rate=2e-4,
        bf16=True,
        logging_steps=1,
        optim="adamw_8bit",
        output_dir="outputs",
        report_to="none",
    ),
)
trainer.train()
