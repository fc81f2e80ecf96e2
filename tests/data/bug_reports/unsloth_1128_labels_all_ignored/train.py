"""unsloth SFT on ShareGPT data in ChatML (unslothai/unsloth#1128): train_on_responses_only is given Llama-3
header markers, which never occur in ChatML text, so every label position is masked (-100).
"""
from datasets import load_dataset
from transformers import TrainingArguments
from trl import SFTTrainer
from unsloth import FastLanguageModel
from unsloth.chat_templates import train_on_responses_only

model, tokenizer = FastLanguageModel.from_pretrained("unsloth/Qwen2.5-7B-Instruct", max_seq_length=2048,
                                                     load_in_4bit=True)
model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, target_modules=["q_proj", "v_proj"])
dataset = load_dataset("json", data_files="sharegpt_chatml.json", split="train")
trainer = SFTTrainer(model=model, tokenizer=tokenizer, train_dataset=dataset, dataset_text_field="text",
                     max_seq_length=2048,
                     args=TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=4,
                                            learning_rate=2e-4, max_steps=60, bf16=True, output_dir="outputs"))
trainer = train_on_responses_only(trainer, instruction_part="<|start_header_id|>user<|end_header_id|>\n\n",
                                  response_part="<|start_header_id|>assistant<|end_header_id|>\n\n")
trainer.train()
