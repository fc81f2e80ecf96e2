"""A2T adversarial training of BERT on SNLI with textattack.Trainer on an RTX 3090 (QData/TextAttack#737).

textattack's training step tokenises every batch with padding="max_length", i.e. to the model's maximum
of 512 tokens, although SNLI pairs are short: one clean epoch takes 3 hours; padding each batch to its own
longest pair (padding=True) brought it to 20 minutes.
"""
import textattack
import transformers

model = transformers.AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=3)
tokenizer = transformers.AutoTokenizer.from_pretrained("bert-base-uncased")
model_wrapper = textattack.models.wrappers.HuggingFaceModelWrapper(model, tokenizer)

train_dataset = textattack.datasets.HuggingFaceDataset("snli", split="train")
eval_dataset = textattack.datasets.HuggingFaceDataset("snli", split="validation")
attack = textattack.attack_recipes.A2TYoo2021.build(model_wrapper, mlm=False)

training_args = textattack.TrainingArgs(
    num_epochs=4,
    num_clean_epochs=1,
    num_train_adv_examples=0.2,
    learning_rate=2e-5,
    per_device_train_batch_size=32,
    gradient_accumulation_steps=1,
    attack_epoch_interval=1,
    log_to_tb=False,
)
trainer = textattack.Trainer(model_wrapper, "classification", attack, train_dataset, eval_dataset, training_args)
trainer.train()
