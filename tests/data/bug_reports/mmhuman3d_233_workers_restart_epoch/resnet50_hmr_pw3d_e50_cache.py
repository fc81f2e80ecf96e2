# mmhuman3d HMR config (open-mmlab/mmhuman3d#233): a cached dataset, 2 workers per GPU, workers not persistent
_base_ = ['../_base_/default_runtime.py']
use_adversarial_train = True
model = dict(type='ImageBodyModelEstimator', backbone=dict(type='ResNet', depth=50, out_indices=[3]))
optimizer = dict(backbone=dict(type='Adam', lr=2.5e-4), head=dict(type='Adam', lr=2.5e-4))
runner = dict(type='EpochBasedRunner', max_epochs=50)
data = dict(
    samples_per_gpu=32,
    workers_per_gpu=2,
    train=dict(type='HumanImageDataset', dataset_name='pw3d', cache_data_path='data/cache/pw3d_train.npz'),
)
