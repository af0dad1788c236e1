"""The emitter: one kernel text, prefixed by the prelude of the dialect it is compiled as."""
from __future__ import annotations

from importlib import resources

DIALECTS = ("cuda", "opencl")
_EXT = {"cuda": "cu", "opencl": "cl"}


def prelude(dialect: str) -> str:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    here = resources.files("dlcc.backends")
    return here.joinpath(f"prelude_{dialect}.h").read_text() + "\n" + here.joinpath("prelude_common.h").read_text()


def render(kernel_codes: list[str], dialect: str) -> str:
    """Full translation unit: the prelude, then every kernel (already sanitized, no ONNX names)."""
    return prelude(dialect) + "\n/* ---- kernels emitted by dlcc ---- */\n\n" + "\n".join(kernel_codes)


def file_name(dialect: str) -> str:
    return f"kernels.{_EXT[dialect]}"
