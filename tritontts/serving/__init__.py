"""Hosting stages on Triton: the stage classes every family's stages derive from, the
Python-based backend that runs them (triton_backend/, triton_stage.py), chunk scheduling,
cancellation. Imports no family."""
