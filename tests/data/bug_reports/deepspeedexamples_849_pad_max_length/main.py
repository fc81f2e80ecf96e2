"""DeepSpeed-Chat step 1 (supervised fine-tuning), condensed (deepspeedai/DeepSpeedExamples#849).

Every chosen response is tokenised with padding="max_length" to --max_seq_len when the dataset is built,
so each batch carries the full max_seq_len whatever its real lengths; the reporter asks why the batches
are not padded dynamically, which would train much faster.
"""
import argparse

import deepspeed
import torch
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model_name_or_path", type=str, default="facebook/opt-1.3b")
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--max_seq_len", type=int, default=512)
    p.add_argument("--learning_rate", type=float, default=9.65e-6)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p = deepspeed.add_config_arguments(p)
    return p.parse_args()


def create_dataset_split(rows, tokenizer, max_seq_len, end_of_conversation_token="<|endoftext|>"):
    out = []
    for row in rows:
        chosen = tokenizer(row["prompt"] + row["chosen"] + end_of_conversation_token, max_length=max_seq_len,
                           padding="max_length", truncation=True, return_tensors="pt")
        out.append({"input_ids": chosen["input_ids"].squeeze(0),
                    "attention_mask": chosen["attention_mask"].squeeze(0),
                    "labels": chosen["input_ids"].squeeze(0)})
    return out


def main():
    args = parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    train = create_dataset_split(load_rows("Dahoas/rm-static"), tokenizer, args.max_seq_len)
    loader = DataLoader(train, collate_fn=default_data_collator, sampler=DistributedSampler(train),
                        batch_size=args.per_device_train_batch_size)
    engine, *_ = deepspeed.initialize(model=model, args=args, model_parameters=model.parameters())
    for batch in loader:
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
