"""The ROCm container image a run belongs to: its tag and, where known, its digest.

Read from ``GOBLIN_ROCM_IMAGE`` (``repo:tag`` or ``repo:tag@sha256:...``), else
from the packaged ``goblin_assets/rocm_image.lock`` (YAML with ``image`` and
``digest``, read through ``importlib.resources`` so an installed wheel finds
it from any directory).  ``docker manifest inspect`` supplies the digest when
the docker CLI and a registry are reachable; otherwise the digest stays as
recorded.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import yaml

#: The lock file shipped with the package; ``GOBLIN_ROCM_IMAGE`` overrides it.
LOCK_FILE: Traversable = files("goblin_assets") / "rocm_image.lock"


@dataclass(frozen=True)
class ImageRef:
    """An image reference; ``version`` is what Dagster's data version of ``rocm_image`` is."""

    image: str
    digest: str | None
    source: str

    @property
    def version(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


def _registry_digest(image: str, timeout_s: float = 10.0) -> str | None:
    if shutil.which("docker") is None:
        return None
    try:
        out = subprocess.run(["docker", "manifest", "inspect", "--verbose", image], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    import json

    try:
        doc = json.loads(out.stdout)
        doc = doc[0] if isinstance(doc, list) else doc
        return doc.get("Descriptor", {}).get("digest")
    except (ValueError, AttributeError, IndexError):
        return None


def read_rocm_image(lock_file: Path | Traversable | None = None, lookup: bool = False) -> ImageRef:
    """The current ROCm image reference (``none`` when nothing is configured).

    Raises
    ------
    ValueError
        The lock file exists but is not valid YAML, or not a mapping with an
        ``image`` key (the message names the file).
    """
    env = os.environ.get("GOBLIN_ROCM_IMAGE")
    if env:
        image, _, digest = env.partition("@")
        ref = ImageRef(image, digest or None, "env GOBLIN_ROCM_IMAGE")
    else:
        lock = lock_file or LOCK_FILE
        if not lock.is_file():
            return ImageRef("none", None, "not configured")
        try:
            doc = yaml.safe_load(lock.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"{lock}: cannot read the image lock file: {exc}") from None
        if not isinstance(doc, dict) or not doc.get("image"):
            raise ValueError(f"{lock}: expected a YAML mapping with an 'image' key")
        ref = ImageRef(str(doc["image"]), doc.get("digest"), str(lock.name))
    if lookup and ref.image != "none":
        digest = _registry_digest(ref.image)
        if digest and digest != ref.digest:
            ref = ImageRef(ref.image, digest, ref.source + " + docker manifest inspect")
    return ref
