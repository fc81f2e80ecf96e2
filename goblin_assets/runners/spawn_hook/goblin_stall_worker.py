"""The DataLoader worker loop of a ``spawn`` or ``forkserver`` worker under Goblin's harness (runners/stall.py).

Standard library only.  Such a worker is a fresh interpreter that unpickles its target by module and
name.  The harness appends this folder to ``sys.path`` (after the user's own packages: it holds this one
file) and makes :func:`worker_loop` the worker's target, so the worker imports this file, registers its
stack-dump file as a forked worker does (``RUN_DIR/stacks/<pid>.txt`` on the dump signal), then runs
torch's own ``_worker_loop``.  In the harness's own process ``worker_loop`` is replaced by the wrapper that
forked workers run; this file's version runs only in a fresh interpreter.
"""
import importlib.util
import os
from pathlib import Path

#: Set by the harness: the run folder, and the path of runners/stall.py.
RUN_DIR_ENV = "GOBLIN_HARNESS_RUN_DIR"
STALL_ENV = "GOBLIN_HARNESS_STALL"


def worker_loop(*args, **kwargs):
    """Register this worker's stack-dump file (when the harness said where), then run torch's worker loop."""
    out, stall_path = os.environ.get(RUN_DIR_ENV), os.environ.get(STALL_ENV)
    if out and stall_path:
        try:
            spec = importlib.util.spec_from_file_location("goblin_harness_stall", stall_path)
            stall = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(stall)
            stall._register(Path(out))
        except (OSError, ImportError):
            pass  # a worker that cannot register still loads data
    from torch.utils.data._utils.worker import _worker_loop  # a fresh interpreter: torch's own loop

    return _worker_loop(*args, **kwargs)
