"""Packages of goblin-assets, its two top-level data folders, and its one compiled part.

The knowledge base (``kb/``) and the SQL models (``dbt_like_sql/``) live at the top of the
repository, where a person looks for them; ``package_dir`` maps them into the package as
``goblin_assets.kb.data`` and ``goblin_assets.dbt_like_sql``, so a built wheel carries them and
an editable install finds them (setuptools' editable finder maps both folders), and the code
reads them with ``importlib.resources`` from any directory.  Everything else is declared in
pyproject.toml.

The compiled part is the fused CPU sketch kernels.  ``goblin_assets/opscope/_sketch.c``
is a plain shared library that ``goblin_assets/opscope/ckernel.py`` loads with
ctypes (no Python C API).  ``optional=True``: without a C compiler the install
still succeeds and the sketches run on torch ops (same statistics, more passes).
"""
from setuptools import Extension, find_packages, setup

#: Top-level data folders -> the package each is installed as.
DATA_PACKAGES = {"goblin_assets.kb.data": "kb", "goblin_assets.dbt_like_sql": "dbt_like_sql"}

setup(
    packages=find_packages(include=["goblin_assets", "goblin_assets.*"]) + sorted(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
    ext_modules=[Extension(
        "goblin_assets.opscope._sketch",
        sources=["goblin_assets/opscope/_sketch.c"],
        # reassociation vectorises the sums; no FMA contraction keeps the histogram's bin arithmetic
        # identical to torch's float64 ops (see the header of _sketch.c)
        extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
                            "-fno-signed-zeros", "-ffp-contract=off"],
        optional=True,
    )],
)
