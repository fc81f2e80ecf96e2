# t5-base translation fine-tune with the HF example script and --torch_compile (pytorch/pytorch#98102):
# every batch has another source/target length, so the compiled model keeps recompiling.
python examples/pytorch/translation/run_translation.py \
    --model_name_or_path t5-base \
    --do_train \
    --source_lang en --target_lang de \
    --source_prefix "translate English to German: " \
    --dataset_name stas/wmt14-en-de-pre-processed \
    --output_dir /tmp/tst-translation \
    --num_train_epochs 1 \
    --per_device_train_batch_size 16 \
    --max_train_samples 1000 \
    --overwrite_output_dir \
    --predict_with_generate \
    --torch_compile \
    --report_to none
