"""Errors a user can act on.

Every failure that bad input can cause is one of these, so the CLI can print one clear paragraph
and exit non-zero instead of a traceback. Anything else escaping is a dlcc bug.
"""
from __future__ import annotations


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of a foreign exception's message (its type where it has none), cut to
    `limit` characters: what a DlccError quotes of an onnx, onnxruntime or numpy failure."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


class DlccError(Exception):
    """Base class: the message is shown to the user as is."""

    exit_code = 2


class ModelError(DlccError):
    """The ONNX file cannot be read, is malformed, cyclic, or refers to data it must not."""


class ShapeError(DlccError):
    """A dimension is unbound or a --shape binding does not fit the model."""


class UnboundDimError(ShapeError):
    """An input's dim is dynamic and nothing binds it (the API suggests dynamic=True)."""


#: What to do about a model dlcc can compile only in part (UnsupportedOpsError, DynamicShapeError).
FALLBACK_HINT = ("To run {what} on onnxruntime and the rest on dlcc: `dlcc compile` or `dlcc verify` with "
                 "`--fallback onnxruntime`, or dlcc.compile(..., fallback=\"onnxruntime\") in Python")


class DynamicShapeError(ShapeError):
    """A shape depends on tensor values, not only on input shapes (not compilable statically).
    `tensor`: the first tensor whose shape is unknown, where one is known."""

    def __init__(self, message: str, tensor: str | None = None):
        super().__init__(message + "\n" + FALLBACK_HINT.format(what="the nodes that depend on those values"))
        self.tensor = tensor


class UnsupportedControlFlowError(DlccError):
    """An If that dlcc cannot turn into plain nodes (control_flow.py says which and why)."""


class UnsupportedOpsError(DlccError):
    """The graph uses ops dlcc cannot lower; lists every one of them at once."""

    def __init__(self, ops: dict[str, tuple[int, str]], unsupported_dtypes: list[str] | None = None):
        self.ops = ops
        lines = [f"  {op:<24} x{count:<4} first node: {first!r}" for op, (count, first) in sorted(ops.items())]
        msg = (
            f"the model uses {len(ops)} op type(s) dlcc cannot compile yet "
            f"({sum(c for c, _ in ops.values())} node(s)):\n" + "\n".join(lines)
        )
        if unsupported_dtypes:
            msg += "\n" + "\n".join(unsupported_dtypes)
        msg += "\n" + FALLBACK_HINT.format(what="them")
        super().__init__(msg)


class UnsupportedDtypesError(DlccError):
    """Tensors of dtypes the backends cannot hold (float16, double, strings, ...)."""


class ConfigError(DlccError):
    """A YAML config (device, pipeline, batch manifest) is missing, malformed or invalid."""


class CompileError(DlccError):
    """A backend compiler rejected generated code, or a pass left a broken program (a dlcc bug,
    reported with the log or the pass and launch at fault)."""


class RuntimeBackendError(DlccError):
    """The requested target cannot run here (no GPU, no OpenCL platform, missing package)."""


class TraceError(DlccError):
    """A profiler trace that cannot be read: not JSON, truncated, not a Kineto trace, no GPU work."""
