"""Arrays in and out of a compiled model beyond numpy: what PyTorch, CuPy, JAX, numba and
PyOpenCL hand over, read as (where, pointer, shape, dtype, strides), and device outputs handed
back the same ways.

Two protocols carry a device array between libraries:
  - `__cuda_array_interface__` (CAI, numba's; torch, CuPy, numba export it): a dict with the
    pointer, shape, `typestr`, strides (None: C-contiguous) and, from version 3, the stream the
    producer last wrote it on;
  - DLPack (`__dlpack__()` / `__dlpack_device__()`; all of the above and JAX): a PyCapsule holding
    a DLManagedTensor (dlpack.h), which the consumer renames to "used_dltensor" and releases with
    its deleter when done.
PyCUDA reads only a CAI's pointer and ignores its strides and stream, so dlcc reads both protocols
itself (ctypes over the C structs) and checks what it reads: the shape and dtype against the
model's signature, contiguity, and the device. A CPU DLPack tensor (torch on the CPU) is simply
a host array. Nothing here needs a GPU: the parsing and the exporting are exercised on CPU
tensors, which differ from CUDA ones only in their device type.
"""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import DlccError

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_OPENCL, KDL_CUDA_MANAGED = 1, 2, 3, 4, 13
_DEVICE_NAMES = {KDL_CPU: "CPU", KDL_CUDA: "CUDA", KDL_CUDA_HOST: "CUDA pinned host", KDL_OPENCL: "OpenCL",
                 KDL_CUDA_MANAGED: "CUDA managed"}


class InteropError(DlccError):
    """An array handed to (or asked of) a model that dlcc cannot take or give as it is."""


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", _DELETER_V), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

#: DLPack (type code, bits) <-> numpy dtype names (ml_dtypes' bfloat16 for kDLBfloat).
_DL_DTYPES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
              (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
              (2, 64): "float64", (4, 16): "bfloat16", (6, 8): "bool"}
_DL_CODES = {v: k for k, v in _DL_DTYPES.items()}

def _capi(name: str, restype, *argtypes):
    """A CPython C-API function with its own prototype (ctypes.pythonapi's function objects are
    shared process-wide: setting their argtypes would change them for every other user)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_get_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_capsule_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR)
# the same two, on a capsule that is being destroyed (a bare pointer: no new reference to it)
_raw_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_raw_get_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)


@dataclass
class ArrayRef:
    """One input as dlcc reads it. `where`: "host" (then `host` is the numpy array), "cuda" or
    "opencl" (then `ptr` is the first element's address, or `cl_buffer` and `ptr` the byte
    offset into it). `release` is called once the data has been copied (a DLPack deleter)."""

    where: str
    shape: tuple
    dtype: str
    ptr: int = 0
    strides: tuple | None = None  # bytes; None: C-contiguous
    device_id: int | None = None  # CUDA ordinal where the producer says (DLPack); CAI does not
    stream: int | None = None  # CAI v3: the producer's stream (None: nothing to wait for)
    host: np.ndarray | None = None
    cl_buffer: Any = None
    cl_queue: Any = None
    readonly: bool = False  # the producer says it must not be written (an `out=` destination)
    release: Callable[[], None] | None = None
    keep: list = field(default_factory=list)  # objects that must outlive the copy

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    def contiguous(self) -> bool:
        if self.strides is None:
            return True
        expect, acc = [], _itemsize(self.dtype)
        for d in reversed(self.shape):
            expect.append(acc)
            acc *= d
        # a dimension of extent 1 may carry any stride
        return all(s == e or d == 1 for s, e, d in zip(self.strides, reversed(expect), self.shape))

    def done(self) -> None:
        if self.release is not None:
            self.release()
            self.release = None


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _dtype_name(dt) -> str:
    if str(dt) == "bfloat16":
        return "bfloat16"
    return np.dtype(dt).name


def from_cuda_array_interface(x, cai: dict | None = None) -> ArrayRef:
    """An ArrayRef from an object's `__cuda_array_interface__` (versions 0-3; `cai`: the dict,
    where the caller has read it already: torch builds it anew on every read). Its CUDA ordinal
    comes from `__dlpack_device__` where the object has one (torch, CuPy, JAX): CAI does not say
    it, and asking the driver about the pointer is a call per input per inference."""
    cai = x.__cuda_array_interface__ if cai is None else cai
    try:
        shape = tuple(int(d) for d in cai["shape"])
        typestr = cai["typestr"]
        ptr = int(cai["data"][0] or 0)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise InteropError(f"a malformed __cuda_array_interface__ ({e}): {cai!r}") from None
    if cai.get("mask") is not None:
        raise InteropError("a masked __cuda_array_interface__ array is not supported")
    dtype = _typestr_dtype(typestr)
    strides = cai.get("strides")
    try:
        strides = tuple(int(x) for x in strides) if strides is not None else None
        readonly = bool(cai["data"][1]) if len(cai["data"]) > 1 else False
    except (TypeError, ValueError):
        raise InteropError(f"a malformed __cuda_array_interface__ (strides, data): {cai!r}") from None
    if strides is not None and len(strides) != len(shape):
        raise InteropError(f"a malformed __cuda_array_interface__: {len(strides)} strides for {len(shape)} dims")
    if any(d < 0 for d in shape):
        raise InteropError(f"a malformed __cuda_array_interface__: shape {list(shape)}")
    device_id = None
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        try:
            kind, index = dev()
            device_id = int(index) if int(kind) == KDL_CUDA else None
        except Exception:  # noqa: BLE001 (a producer's method may raise anything: ask the driver instead)
            device_id = None
    return ArrayRef("cuda", shape, dtype, ptr=ptr, strides=strides, stream=cai.get("stream"), readonly=readonly,
                    device_id=device_id, keep=[x])


def _typestr_dtype(typestr) -> str:
    """The dtype name of a __cuda_array_interface__ typestr, parsed once per typestr (a call on
    device arrays reads one per input, and the host's time per inference is a floor of its own)."""
    try:
        return _TYPESTRS[typestr]
    except (KeyError, TypeError):
        pass
    try:
        dtype = np.dtype(typestr)
    except TypeError:
        raise InteropError(f"__cuda_array_interface__ typestr {typestr!r} is not a dtype dlcc knows") from None
    # no typestr says bfloat16: a 2-byte void is what producers give for it
    name = "bfloat16" if dtype.kind == "V" and dtype.itemsize == 2 else _dtype_name(dtype)
    if isinstance(typestr, str) and len(_TYPESTRS) < 64:
        _TYPESTRS[typestr] = name
    return name


_TYPESTRS: dict[str, str] = {}


def _parse_capsule(capsule, owner) -> ArrayRef:
    """An ArrayRef over a DLPack capsule (legacy "dltensor" or "dltensor_versioned"), which this
    takes ownership of: renamed "used_...", and its deleter run by ArrayRef.done()."""
    if _capsule_is_valid(capsule, b"dltensor"):
        name, struct = b"dltensor", DLManagedTensor
    elif _capsule_is_valid(capsule, b"dltensor_versioned"):
        name, struct = b"dltensor_versioned", DLManagedTensorVersioned
    else:
        raise InteropError("__dlpack__ returned something other than an unused DLPack capsule")
    addr = _capsule_get_pointer(capsule, name)
    managed = ctypes.cast(addr, ctypes.POINTER(struct)).contents
    if struct is DLManagedTensorVersioned and managed.version.major > 1:
        raise InteropError(f"DLPack {managed.version.major}.{managed.version.minor} is newer than dlcc reads (1.x)")
    t = managed.dl_tensor
    _capsule_set_name(capsule, b"used_" + name)

    def release(managed=managed, struct=struct, addr=addr):
        if managed.deleter:
            managed.deleter(ctypes.cast(addr, ctypes.POINTER(struct)))

    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _DL_DTYPES:
        release()
        raise InteropError(f"a DLPack tensor of type code {t.dtype.code}, {t.dtype.bits} bits x {t.dtype.lanes} "
                           "lanes is not a dtype dlcc takes")
    dtype = _DL_DTYPES[key]
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    item = np.dtype(dtype).itemsize
    strides = tuple(int(t.strides[i]) * item for i in range(t.ndim)) if t.strides else None
    ptr = (t.data or 0) + int(t.byte_offset)
    kind = t.device.device_type
    if kind in (KDL_CPU, KDL_CUDA_HOST):
        n = int(np.prod(shape, dtype=np.int64))
        if strides is not None and not ArrayRef("host", shape, dtype, strides=strides).contiguous():
            release()
            raise InteropError("a non-contiguous CPU DLPack tensor: make it contiguous first")
        buf = (ctypes.c_char * (n * item)).from_address(ptr) if n else b""
        host = np.frombuffer(buf, np.uint8).view(dtype if dtype != "bfloat16" else np.uint16).reshape(shape)
        if dtype == "bfloat16":
            import ml_dtypes

            host = host.view(ml_dtypes.bfloat16)
        host = host.copy()  # ours, so the producer's memory is released now
        release()
        return ArrayRef("host", shape, dtype, host=host)
    if kind not in (KDL_CUDA, KDL_CUDA_MANAGED):
        release()
        raise InteropError(f"a DLPack tensor on a {_DEVICE_NAMES.get(kind, f'type {kind}')} device: dlcc takes CPU "
                           "and CUDA ones")
    readonly = struct is DLManagedTensorVersioned and bool(managed.flags & 1)  # DLPACK_FLAG_BITMASK_READ_ONLY
    return ArrayRef("cuda", shape, dtype, ptr=ptr, strides=strides, device_id=int(t.device.device_id),
                    readonly=readonly, release=release, keep=[owner, capsule])


def from_dlpack(x, stream: int | None = 1) -> ArrayRef:
    """An ArrayRef from an object's `__dlpack__`: CPU tensors become host arrays (copied), CUDA
    ones are read in place. `stream` is the consumer's (1: CUDA's legacy default stream, which
    dlcc launches on), so the producer orders its pending writes before it."""
    try:
        dev_type, _ = x.__dlpack_device__()
    except Exception as e:
        raise InteropError(f"__dlpack_device__ failed: {e}") from None
    if int(dev_type) == KDL_CPU:
        try:  # numpy reads CPU tensors of any strides; not bfloat16, which the parse below does
            host = np.from_dlpack(x)
            return ArrayRef("host", host.shape, _dtype_name(host.dtype), host=host)
        except (TypeError, BufferError, RuntimeError, ValueError):
            pass
    kw = {"stream": stream} if int(dev_type) in (KDL_CUDA, KDL_CUDA_MANAGED) else {}
    try:
        capsule = x.__dlpack__(**kw)
    except TypeError:
        capsule = x.__dlpack__()
    return _parse_capsule(capsule, x)


def describe(x) -> ArrayRef:
    """Any input value as an ArrayRef: numpy (and anything np.asarray takes) on the host, a
    PyOpenCL array, a CAI or DLPack device array."""
    if isinstance(x, np.ndarray):
        return ArrayRef("host", x.shape, _dtype_name(x.dtype), host=x)
    if type(x).__module__.startswith("pyopencl") and hasattr(x, "base_data") and hasattr(x, "queue"):
        if not x.flags.c_contiguous:
            raise InteropError("a non-contiguous pyopencl array: make it contiguous first")
        return ArrayRef("opencl", tuple(x.shape), _dtype_name(x.dtype), ptr=int(x.offset), cl_buffer=x.base_data,
                        cl_queue=x.queue, keep=[x])
    try:  # a producer's property may raise anything (torch raises AttributeError on CPU tensors)
        cai = getattr(x, "__cuda_array_interface__", None)  # read once: torch builds it on every read
        if cai is not None:
            return from_cuda_array_interface(x, cai)
        if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
            return from_dlpack(x)
    except InteropError:
        raise
    except Exception as e:
        raise InteropError(f"reading a {type(x).__name__} as a device array failed: {type(e).__name__}: {e}") from None
    return ArrayRef("host", (), "", host=None, keep=[x])  # check_inputs converts it with np.asarray


# -- device outputs ------------------------------------------------------------------------------
_LIVE: dict[int, tuple] = {}  # DLManagedTensor address -> what it keeps alive until its deleter runs


@_DELETER
def _managed_deleter(p):
    _LIVE.pop(ctypes.addressof(p.contents), None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(obj):
    """A capsule nobody consumed (still named "dltensor") releases its tensor itself."""
    if _raw_is_valid(obj, b"dltensor"):
        addr = _raw_get_pointer(obj, b"dltensor")
        _LIVE.pop(addr, None)


_CAPSULE_NAME = ctypes.c_char_p(b"dltensor")


def dlpack_capsule(ptr: int, shape: tuple, dtype: str, device: tuple[int, int], owner) -> object:
    """A legacy DLPack capsule over `ptr` (C-contiguous `shape` of `dtype` on `device`), keeping
    `owner` (what frees the memory) alive until the consumer's deleter runs."""
    code = _DL_CODES.get(_dtype_name(dtype))
    if code is None:
        raise InteropError(f"dtype {dtype} has no DLPack type")
    managed = DLManagedTensor()
    shape_arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    t = managed.dl_tensor
    t.data, t.ndim, t.shape, t.strides, t.byte_offset = ptr or None, len(shape), shape_arr, None, 0
    t.device = DLDevice(*device)
    t.dtype = DLDataType(code[0], code[1], 1)
    managed.deleter = _managed_deleter
    addr = ctypes.addressof(managed)
    _LIVE[addr] = (managed, shape_arr, owner)
    return _capsule_new(addr, _CAPSULE_NAME, _capsule_destructor)


class DeviceArray:
    """A model output left on the GPU (`run(..., outputs="device")`): its own allocation (never
    a buffer the next inference overwrites), exported through `__cuda_array_interface__` (torch,
    CuPy, numba) and DLPack (`torch.from_dlpack`, `cupy.from_dlpack`, `jax.dlpack`). `get()` copies
    it to a numpy array. The model may still be writing it when run() returns: both exports name
    the stream it is written on (CUDA's legacy default stream) or order the consumer's stream after
    it, and `get()` waits for it."""

    def __init__(self, alloc, shape: tuple, dtype: str, device_id: int, runtime):
        self._alloc, self.shape, self.dtype, self.device_id, self._rt = alloc, tuple(shape), dtype, device_id, runtime

    @property
    def ptr(self) -> int:
        return int(self._alloc)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = "<V2" if self.dtype == "bfloat16" else np.dtype(self.dtype).str
        # stream 1, CUDA's legacy default stream: where the model wrote it, perhaps still writing
        # (run() returns before the device finished when its outputs stay on the device)
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": 1}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"the array is on CUDA device {self.device_id}; dlcc does not copy it to {dl_device}")
        if copy:
            raise BufferError("dlcc exports its device arrays without a copy")
        if stream is not None and int(stream) not in (-1, 0, 1, 2):
            # the consumer's stream waits for the model's work (DLPack: the producer orders it);
            # the default streams (1 legacy, 2 per-thread) already follow dlcc's, -1 asks for nothing
            self._rt.join(int(stream), into_ours=False)
        return dlpack_capsule(self.ptr, self.shape, self.dtype, self.__dlpack_device__(), self)

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, np.dtype(self.dtype))
        self._rt.read(self._alloc, 0, out)
        return out

    def __del__(self):
        """The block goes back to the runtime's pool inside its context (CudaRuntime.free_output):
        the last reference may go anywhere, in a DLPack deleter that torch runs or on a thread
        that never ran a model. Best effort at interpreter exit, when the context may be gone."""
        alloc, self._alloc = getattr(self, "_alloc", None), None
        free = getattr(getattr(self, "_rt", None), "free_output", None)
        if alloc is not None and free is not None and hasattr(alloc, "free"):
            try:
                free(alloc)
            except Exception:  # noqa: BLE001 (a finalizer must not raise)
                pass

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, cuda:{self.device_id})"
