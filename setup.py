"""Build step for the one compiled part of goblin-assets: the fused CPU sketch kernels.

Everything else is declared in pyproject.toml.  ``goblin_assets/opscope/_sketch.c``
is a plain shared library that ``goblin_assets/opscope/ckernel.py`` loads with
ctypes (no Python C API).  ``optional=True``: without a C compiler the install
still succeeds and the sketches run on torch ops (same statistics, more passes).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "goblin_assets.opscope._sketch",
    sources=["goblin_assets/opscope/_sketch.c"],
    # reassociation vectorises the sums; no FMA contraction keeps the histogram's bin arithmetic
    # identical to torch's float64 ops (see the header of _sketch.c)
    extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
                        "-ffp-contract=off"],
    optional=True,
)])
