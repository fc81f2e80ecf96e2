#!/bin/bash
# verl PPO with Hydra overrides (written here)
python3 -m verl.trainer.main_ppo \
    data.train_batch_size=256 \
    actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat \
    actor_rollout_ref.actor.optim.lr=5e-7 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    critic.optim.lr=1e-5 \
    trainer.n_gpus_per_node=8 trainer.nnodes=1
