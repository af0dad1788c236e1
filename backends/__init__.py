"""Backends: an emitter (dialect source → CUDA C or OpenCL C text) plus a thin runtime each.

All launch, buffer and plan logic is shared (dlcc.executor); a runtime only allocates, copies,
builds a program and launches by name. That keeps the CUDA path — which cannot run on the
project's own machines — as small as possible and everything around it tested on OpenCL.
"""
from .source import DIALECTS, render  # noqa: F401
