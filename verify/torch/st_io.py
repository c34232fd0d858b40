"""Read and write safetensors files with the standard library and torch only.

The format (https://github.com/huggingface/safetensors, README "Format"): an
unsigned 64-bit little-endian header size N, N bytes of JSON mapping each tensor
name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the byte
buffer that follows the header) plus an optional "__metadata__" of strings, then
the raw little-endian C-order data. This module does not need the `safetensors`
package; it is not a general implementation (only the dtypes shardbench writes).
"""

import json
import struct
import sys

import torch

_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
}
_NAMES = {v[0]: k for k, v in _DTYPES.items()}


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file; str() is one line naming the file."""


def load(path):
    """Returns (tensors: dict name -> tensor (owning its memory), metadata: dict of str)."""
    if sys.byteorder != "little":
        raise SafetensorsError(f"{path}: this reader assumes a little-endian host")
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: {len(blob)} bytes, shorter than the 8-byte header size")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise SafetensorsError(f"{path}: header size {n} is past the end of the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n :]
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError(f"{path}: __metadata__ is not a map of strings")
    out = {}
    for name, info in header.items():
        try:
            dt, size = _DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor '{name}': bad or unsupported entry {info!r}") from None
        numel = 1
        for d in shape:
            if d < 0:
                raise SafetensorsError(f"{path}: tensor '{name}': negative dim in shape {shape}")
            numel *= d
        if not (0 <= begin <= end <= len(data)) or end - begin != numel * size:
            raise SafetensorsError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not hold "
                f"{numel} x {info['dtype']} inside {len(data)} data bytes")
        # A fresh bytearray per tensor: the copy is aligned and owned by the tensor.
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=dt) if numel else torch.empty(0, dtype=dt)
        out[name] = t.reshape(shape)
    return out, dict(meta)


def save(path, tensors, metadata=None):
    """Writes tensors (dict name -> tensor of a dtype in _DTYPES) and string metadata to path."""
    header = {}
    chunks = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise SafetensorsError(f"{path}: tensor '{name}': dtype {t.dtype} not supported")
        b = t.numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)  # pad so the data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in chunks:
            f.write(b)
