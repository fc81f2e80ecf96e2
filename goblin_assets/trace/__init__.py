"""Analyses of recorded GPU traces (Kineto and rocprofv3): one module per analysis, frames in and out."""
