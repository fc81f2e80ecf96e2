#!/bin/bash
# LUMI-AI-Guide DDP example (Lumi-supercomputer/LUMI-AI-Guide#3): 7 ranks per node, each told to use 7 OpenMP threads
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=7
export OMP_NUM_THREADS=7
torchrun --standalone --nnodes=1 --nproc_per_node=7 ddp_visiontransformer.py --batch-size 32 --num-workers 0
