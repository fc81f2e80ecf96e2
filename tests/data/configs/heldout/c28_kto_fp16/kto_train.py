from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import KTOConfig, KTOTrainer

base = "HuggingFaceTB/SmolLM2-360M-Instruct"
model = AutoModelForCausalLM.from_pretrained(base)
ref = AutoModelForCausalLM.from_pretrained(base)
tok = AutoTokenizer.from_pretrained(base)

train = load_dataset("trl-lib/kto-mix-14k", split="train")

# older GPUs: fp16 instead of bf16
cfg = KTOConfig(
    output_dir="smollm-kto",
    learning_rate=5e-7,
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    fp16=True,
    dataloader_num_workers=4,
)
KTOTrainer(model=model, ref_model=ref, args=cfg, train_dataset=train, processing_class=tok).train()
