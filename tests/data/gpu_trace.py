"""A small GPU (CUDA/ROCm) Chrome trace in torch.profiler's Kineto schema, for tests.

No GPU is lent to CI, so the GPU side of the trace reader and the waste
budget is tested on a trace written here with the event kinds, categories and
argument names torch.profiler writes for a CUDA/ROCm run
(``docs/sources.md`` "Profiler trace format"): ``ProfilerStep#N``
user annotations, ``cpu_op`` events with ``External id``, ``Input Dims`` and
``Input type`` (``record_shapes=True``), ``cuda_runtime`` launch calls and
``kernel`` events linked to them by ``correlation`` and to their op by
``External id``, ``ac2g`` flow events, and ``deviceProperties``.  Holistic
Trace Analysis loading the same file (tests/test_gpu_trace.py) is the
independent check that the schema is the profiler's.

Per step (µs): an fp32 ``aten::addmm`` of 64x100 @ 100x256 whose kernel runs
40 µs, a bf16 ``aten::mm`` of 128x128 @ 128x128 whose kernel runs 20 µs, and an
elementwise optimizer kernel of 10 µs; the step lasts 200 µs, 30 of them in
the data loader.  A gradient all-reduce (``c10d::allreduce_`` launching the
``ncclDevKernel_Generic`` kernel, named as in the MI300X ResNet trace of
TraceLens's tests) runs 30 µs on a second stream, from 10 µs into the mm
kernel: 10 µs overlap compute, 20 µs are exposed.
"""
from __future__ import annotations

import json
from pathlib import Path

STEP_US = 200.0
PID, TID, STREAM, COMM_STREAM = 4242, 4242, 7, 13

#: (op name, Input Dims, Input type, kernel name, op start offset, kernel duration) per step.
OPS = [
    ("aten::addmm", [[256], [64, 100], [100, 256], [], []], ["float", "float", "float", "Scalar", "Scalar"],
     "ampere_sgemm_64x64_tn", 40.0, 40.0),
    ("aten::mm", [[128, 128], [128, 128]], ["c10::BFloat16", "c10::BFloat16"],
     "Cijk_Alik_Bljk_BBS_BH_MT128x128x32_MI16x16x1", 95.0, 20.0),
    ("aten::add_", [[256], [256], []], ["float", "float", "Scalar"],
     "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", 150.0, 10.0),
]
STEPS = (2, 3, 4)
#: The collective per step: (op, kernel, kernel start offset in the step, kernel duration), µs.
COLLECTIVE = ("c10d::allreduce_", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", 110.0, 30.0)
#: Per step: collective kernel time, and the part of it no other kernel overlaps (µs).
COLLECTIVE_US, EXPOSED_US = 30.0, 20.0


def gpu_trace(device_name: str = "NVIDIA H100 80GB HBM3") -> dict:
    """The trace document (a dict ready for ``json.dump``)."""
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": STREAM, "args": {"name": f"stream {STREAM}"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": COMM_STREAM, "args": {"name": f"stream {COMM_STREAM}"}},
    ]
    ext = corr = 0
    t0 = 1_000_000.0
    for i, step in enumerate(STEPS):
        s = t0 + i * STEP_US
        ext += 1
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": PID, "tid": TID,
                   "ts": s, "dur": STEP_US, "args": {"External id": ext, "Record function id": 0}})
        ext += 1
        ev.append({"ph": "X", "cat": "user_annotation",
                   "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                   "pid": PID, "tid": TID, "ts": s + 1, "dur": 30.0, "args": {"External id": ext}})
        # (op, Input Dims, Input type, kernel, op offset, kernel duration, stream, kernel offset)
        launches = [(*op, STREAM, op[4] + 5) for op in OPS]
        c_op, c_kernel, c_off, c_dur = COLLECTIVE
        launches.append((c_op, [[256]], ["float"], c_kernel, c_off - 5, c_dur, COMM_STREAM, c_off))
        for name, dims, types, kernel, off, kdur, stream, k_off in launches:
            ext += 1
            corr += 1
            op_ts = s + off
            ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": TID, "ts": op_ts, "dur": 8.0,
                       "args": {"External id": ext, "Sequence number": ext, "Fwd thread id": 0,
                                "Record function id": 0, "Input Dims": dims, "Input type": types,
                                "Input Strides": [[1] * len(d) for d in dims], "Ev Idx": ext}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID,
                       "ts": op_ts + 2, "dur": 4.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
            k_ts = s + k_off
            ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": k_ts, "dur": kdur,
                       "args": {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": stream,
                                "correlation": corr, "registers per thread": 96, "shared memory": 0,
                                "blocks per SM": 1.0, "warps per SM": 4.0, "grid": [4, 1, 1],
                                "block": [256, 1, 1], "est. achieved occupancy %": 25}})
            ev.append({"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": op_ts + 2, "cat": "ac2g", "name": "ac2g"})
            ev.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": k_ts, "cat": "ac2g", "name": "ac2g",
                       "bp": "e"})
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": device_name, "totalGlobalMem": 85_031_714_816, "computeMajor": 9,
                              "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                              "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
                              "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472, "numSms": 132,
                              "sharedMemPerBlockOptin": 232448}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "record_shapes": 1, "with_flops": 1,
        "traceEvents": ev,
        "traceName": "gpu_fixture.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }


def write_gpu_trace(path: str | Path, **kw) -> Path:
    """Write :func:`gpu_trace` to ``path`` and return it."""
    path = Path(path)
    path.write_text(json.dumps(gpu_trace(**kw)))
    return path
