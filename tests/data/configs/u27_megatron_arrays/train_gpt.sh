#!/bin/bash
# A Megatron-LM style launch: arguments kept in bash arrays (written here)
GPUS_PER_NODE=8
NUM_NODES=1
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
MODEL_ARGS=(
    --num-layers 24
    --hidden-size 2048
    --num-attention-heads 16
    --seq-length 4096
    --max-position-embeddings 4096
)
TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size 512
    --train-iters 100000
    --bf16
    --lr 2.0e-4
    --min-lr 2.0e-5
    --lr-decay-style cosine
    --lr-warmup-iters 2000
    --recompute-activations
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 1
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${PARALLEL_ARGS[@]}
