#!/bin/bash
# Transformer translation with fairseq, batches sized in tokens (written here)
CUDA_VISIBLE_DEVICES=0 fairseq-train data-bin/de-en \
    --task translation --arch transformer --share-decoder-input-output-embed \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 \
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 \
    --dropout 0.3 --weight-decay 0.0001 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 4096 --update-freq 8 --fp16 --num-workers 4
