# The native shim is built by cffi's setuptools hook; everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["build_ffi.py:ffibuilder"])
