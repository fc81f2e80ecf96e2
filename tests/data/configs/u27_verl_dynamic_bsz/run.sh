#!/bin/bash
# verl PPO with token-count micro-batches (written here): no fixed number of backward
# passes per optimizer step, and the micro batch size is not stated at all.
python3 -m verl.trainer.main_ppo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    trainer.n_gpus_per_node=2
