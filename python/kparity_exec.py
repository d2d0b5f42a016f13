"""kparity_exec: serve kernels to kparity's exec protocol (kparity.exec/1; harness/kp_exec.h has it whole).

    import kparity_exec

    def topk(inputs, case):                    # inputs: the family's input names -> numpy arrays (this run's rows)
        scores = inputs["scores"]              # case: {"name", "family", "fields": {...}, "rows": [...]}
        ...
        return {"indices": idx, "values": val} # the family's output names -> arrays (numpy, or torch tensors)

    kparity_exec.serve({"torch.topk": topk}, family="topk")

A config then names the program as an impl:
    "impls": {"topk.torch": {"exec": ["python3", "my_topk.py"], "impl": "torch.topk"}}
and kparity drives it through every check: one request per launch (each full batch, repeat, batch probe), inputs and
outputs as .npy arrays in a shared memory file. Only numpy is needed; with `device="cuda"` inputs arrive as torch
tensors on the GPU (bf16 as torch.bfloat16) and, when kparity asks (bench), each call is timed with CUDA events after
the L2 cache is flushed. A shared input kparity did not rewrite since the last request (a MoE's weights, an MLA cache)
is handed over as the same object again, so fn may keep what it derives from it (keyed on `is`) and must not write into
its inputs. Raise NotSupported for a shape the kernel refuses; any other exception fails that launch
(the traceback goes to kparity's receipt) and the program keeps serving.
"""
import io
import json
import mmap
import os
import platform
import sys
import traceback

import numpy as np

PROTOCOL = "kparity.exec/1"
BF16 = "<u2"  # how kparity stores bf16: its bits


class NotSupported(Exception):
    """The kernel does not run this shape: the launch is NOT_SUPPORTED, not failed."""


def _versions(device):
    v = {"python": platform.python_version(), "numpy": np.__version__, "client": PROTOCOL}
    if device != "cuda" and "torch" not in sys.modules:
        return v  # importing torch takes seconds: only for a program that uses it
    try:
        import torch  # optional

        v["torch"] = torch.__version__
        v["torch_cuda"] = torch.version.cuda or ""
        if device == "cuda" and torch.cuda.is_available():
            v["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return v


def _read_npy(buf, offset, nbytes):
    """An array from a whole .npy at offset: its header parsed in place, its data copied once (the shared file is
    remapped as it grows, so no view into it outlives the request)."""
    head = io.BytesIO(buf[offset:offset + min(nbytes, 65536 + 12)])
    version = np.lib.format.read_magic(head)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(head)
    if fortran:
        raise ValueError("a fortran-order input")
    count = int(np.prod(shape, dtype=np.int64))
    data = np.frombuffer(buf, dtype=dtype, count=count, offset=offset + head.tell())
    return data.reshape(shape).copy()


def _npy_header(arr):
    """The .npy (1.0) header of arr, padded so the data starts 64-byte aligned, as numpy writes it."""
    d = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (arr.dtype.str, tuple(arr.shape))
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    d = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + len(d).to_bytes(2, "little") + d.encode("latin1")


def _to_numpy(x, spec_dtype):
    """An output as numpy, bf16 tensors as their bits."""
    if hasattr(x, "detach"):  # a torch tensor
        import torch

        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)
        x = x.cpu().numpy()
        if spec_dtype == BF16 and x.dtype == np.int16:
            x = x.view(np.uint16)
    return np.ascontiguousarray(np.asarray(x))


def _to_device(a, spec_dtype):
    import torch

    if spec_dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(a.copy()).cuda()


class _Timer:
    """CUDA events around one call, the L2 flushed before it (as kparity bench does for its own impls)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def time(self, fn):
        torch = self.torch
        self.flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        stop.record()
        torch.cuda.synchronize()
        return out, start.elapsed_time(stop) * 1000.0


def serve(impls, family=None, device="cpu"):
    """Serve `impls` (name -> fn(inputs, case) -> outputs) until kparity closes the requests. `family` is the kparity
    family every impl serves (or a dict name -> family). device "cuda" hands fn torch tensors on the GPU."""
    fams = family if isinstance(family, dict) else {name: family for name in impls}
    for name in impls:
        if not fams.get(name):
            raise ValueError("kparity_exec.serve: no family for impl %r" % name)
    # replies go to the real stdout alone: anything the kernel or its libraries print goes to stderr
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    replies.write(json.dumps({"protocol": PROTOCOL, "impls": {n: {"family": fams[n]} for n in impls},
                              "versions": _versions(device)}) + "\n")
    fd = int(os.environ.get("KPARITY_EXEC_SHM_FD", "3"))
    mapped, mapped_bytes = None, 0
    timer = None
    kept = {}  # each input of the last request: (offset, bytes), what fn was given
    for line in sys.stdin:
        req = json.loads(line)
        rid = req.get("id")
        try:
            size = int(req["shm_bytes"])
            if size != mapped_bytes:
                if mapped is not None:
                    mapped.close()
                mapped, mapped_bytes = mmap.mmap(fd, size), size
            fn = impls.get(req["impl"])
            if fn is None:
                raise KeyError("this program does not serve %r" % req["impl"])
            inputs, (last, kept) = {}, (kept, {})
            for e in req["inputs"]:
                where, held = (e["offset"], e["bytes"]), last.get(e["name"])
                if e.get("reused") and held and held[0] == where:  # a shared input as the last request had it
                    inputs[e["name"]] = held[1]
                else:
                    a = _read_npy(mapped, e["offset"], e["bytes"])
                    inputs[e["name"]] = _to_device(a, a.dtype.str) if device == "cuda" else a
                kept[e["name"]] = (where, inputs[e["name"]])
            specs = {o["name"]: o for o in req["outputs"]}
            case = dict(req["case"], rows=req["rows"])
            device_us = None
            if req.get("time") and device == "cuda":
                timer = timer or _Timer()
                outputs, device_us = timer.time(lambda: fn(inputs, case))
            else:
                outputs = fn(inputs, case)
            written = {}
            for name, value in outputs.items():
                spec = specs.get(name)
                if spec is None and name in req.get("absent", ()):
                    continue  # the config declares it absent: not asked for
                if spec is None:
                    raise KeyError("output %r is not one of this family's: %s" % (name, ", ".join(specs)))
                arr = _to_numpy(value, spec["dtype"])
                header = _npy_header(arr)
                total = len(header) + arr.nbytes
                if total > spec["capacity"]:
                    raise ValueError("output %r: %s %s is %d bytes as .npy; kparity expects %s %s (at most %d bytes)"
                                     % (name, arr.dtype.str, arr.shape, total, spec["dtype"], tuple(spec["shape"]),
                                        spec["capacity"]))
                at = spec["offset"]
                mapped[at:at + len(header)] = header  # the header, then the data straight into the shared file
                np.frombuffer(mapped, dtype=arr.dtype, count=arr.size, offset=at + len(header))[:] = arr.reshape(-1)
                written[name] = total
            reply = {"id": rid, "status": "ok", "outputs": written}
            if device_us is not None:
                reply["device_us"] = device_us
        except NotSupported as e:
            reply = {"id": rid, "status": "not_supported", "message": str(e)}
        except Exception as e:  # the launch fails; the program keeps serving, unless its CUDA context is gone
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            reply = {"id": rid, "status": "error", "message": "%s: %s" % (type(e).__name__, e)}
            if device == "cuda" and _context_lost():
                reply["context_lost"] = True  # kparity ends this program; its next launch starts a fresh one
        replies.write(json.dumps(reply) + "\n")
        if reply.get("context_lost"):
            return 3
    return 0


def _context_lost():
    """Whether this process's CUDA context is unusable (a sticky error: an illegal address in the kernel)."""
    try:
        import torch

        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any failure to synchronize leaves nothing to serve with
        return True
