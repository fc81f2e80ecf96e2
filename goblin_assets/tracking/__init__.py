"""Experiment tracking: an audit logged beside the training run it audited (MLflow)."""
