#!/bin/bash
# verl GRPO (written here): each prompt is answered rollout.n times, and the actor's
# mini batch counts prompts, so the per-GPU mini batch is 32 x 8 // 4 = 64 responses.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=128 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=3e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.n=8 \
    trainer.n_gpus_per_node=4 \
    trainer.nnodes=1 "$@"
