# The reporter's launch line (facebookresearch/deit#81): 8 processes on one 32-CPU node.
python -m torch.distributed.launch --nproc_per_node=8 --use_env main.py \
    --num_workers 32 --model deit_tiny_patch16_224 --batch-size 128 --repeated-aug \
    --data-path /data/ILSVRC2012 --output_dir ./result
