#!/bin/bash
# RoBERTa-style masked-LM pre-training with fairseq (written here)
TOTAL_UPDATES=50000
WARMUP_UPDATES=3000
PEAK_LR=0.0004
TOKENS_PER_SAMPLE=512
MAX_SENTENCES=32
UPDATE_FREQ=4
fairseq-train --fp16 data-bin/corpus \
    --task masked_lm --criterion masked_lm \
    --arch roberta_base --sample-break-mode complete --tokens-per-sample $TOKENS_PER_SAMPLE \
    --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --clip-norm 0.0 \
    --lr-scheduler polynomial_decay --lr $PEAK_LR --warmup-updates $WARMUP_UPDATES \
    --total-num-update $TOTAL_UPDATES --max-update $TOTAL_UPDATES \
    --batch-size $MAX_SENTENCES --update-freq $UPDATE_FREQ --log-interval 10
