"""The optional compiled part of ringlet: ringlet._lean, the small-message path (see
src/ringlet/lean.py).  Everything else is in pyproject.toml.  Without a C compiler the
build skips it (optional=True) and ringlet runs every call on its Python path."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ringlet._lean", ["src/ringlet/_lean.c"], optional=True,
                             extra_compile_args=["-O3", "-fno-fast-math"])])
