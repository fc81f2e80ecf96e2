"""Causal-LM fine-tune with the HF Trainer and gradient accumulation, transformers 4.30
(huggingface/transformers#24725): with accumulation the loss is averaged per micro-batch and then over
micro-batches (a macro average), so with variable-length samples the result is noticeably worse than the
same global batch without accumulation.
"""
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)

MODEL = "EleutherAI/pythia-1.4b"

tokenizer = AutoTokenizer.from_pretrained(MODEL)
tokenizer.pad_token = tokenizer.eos_token
model = AutoModelForCausalLM.from_pretrained(MODEL)

raw = load_dataset("tatsu-lab/alpaca", split="train")
train = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=512), batched=True,
                remove_columns=raw.column_names)

args = TrainingArguments(
    output_dir="pythia-alpaca",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=16,
    learning_rate=2e-5,
    num_train_epochs=3,
    fp16=True,
    logging_steps=10,
    report_to="none",
)
Trainer(model=model, args=args, train_dataset=train,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()
