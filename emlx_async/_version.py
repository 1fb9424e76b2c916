# Baked into the compiled shim too; emlx_async/_native.py checks they match.
__version__ = "0.1.0"
