"""The child process that runs a compiled CUDA library (see cuda_runner.py).

argv: the spec file (JSON). The library is loaded with ctypes here, so a
crash, an abort from the emulator's checks or a hang kills only this process.
Two calls, one protocol (the spec's ``call``):

* ``entry``: ``spec["entry"](void** buffers, const long long* ints)``: each
  buffer file is read into its own 256-byte-aligned host allocation
  (``cudaMalloc``'s alignment; under emulation device memory is host memory),
  and written back after the call. For hand-written kernels.
* ``model``: a generated model's C API (``blockc_model.h``): ``blockc_create``
  from the weights file, ``blockc_reserve`` for ``spec["reserve"]`` (else the
  run's dims), inputs copied to device memory, ``spec["runs"]`` (1 if not
  given) ``blockc_run`` calls, a device synchronize, outputs copied back to
  their files. With ``spec["time"]`` the run is instead timed by blockc's one
  timing loop (``runtime/timing.py``'s ``measure``) on the device's clock:
  CUDA events recorded on the run's stream before and after each run. The
  per-run seconds go into the result. An output with ``"alias": k`` is
  written into input k's device buffer (a decode step's cache in place),
  and read back from there.

* ``session``: a generated model kept loaded between runs, for a step run
  again and again with state carried from each run to the next (a KV cache,
  ``cuda_runner.CudaSession``): ``spec["carry"]`` maps output positions to
  input positions whose buffer they share, those inputs' first values are
  ``spec["state"]`` files, and then each line on standard input is a command
  (``run``, ``read`` or ``close``, JSON) answered by one line on standard
  output that starts with ``blockc-session``. A carried buffer is the same
  device memory as input and output, so the cache never leaves the device.

The result file gets ``{"rc", "where", "error", "times", "counters"}``:
``rc`` 0, or the non-zero status the library returned from the function
``where`` (with its error text); ``counters``, from an emulated library, what
the emulator counted during the runs (``blockc_emu_counters``: device
allocations, kernel launches, graph captures, ...). This file imports only
the standard library, and the timing module by its path, not through the
blockc package: a run starts in stdlib time.
"""
import ctypes
import importlib.util
import json
import sys


class Failed(Exception):
    """The library returned a non-zero status."""

    def __init__(self, where: str, rc: int, error: str = ""):
        super().__init__(where)
        self.where, self.rc, self.error = where, rc, error


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _function(lib, name: str, restype, argtypes):
    try:
        fn = getattr(lib, name)
    except AttributeError:
        sys.exit("blockc child runner: %s exports no function %s" % (lib._name, name))
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def call_entry(lib, spec: dict) -> dict:
    libc = ctypes.CDLL(None)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    fn = _function(lib, spec["entry"], ctypes.c_int,
                   [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong)])
    ptrs = []
    for b in spec["buffers"]:
        p = ctypes.c_void_p()
        if libc.posix_memalign(ctypes.byref(p), 256, max(b["nbytes"], 1)) != 0:
            sys.exit("blockc child runner: out of memory")
        data = _read(b["path"])
        ctypes.memmove(p, data, len(data))
        ptrs.append(p.value)
    buffers = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
    ints = (ctypes.c_longlong * max(len(spec["ints"]), 1))(*spec["ints"])
    rc = fn(buffers, ints)
    sys.stderr.flush()
    for b, p in zip(spec["buffers"], ptrs):
        _write(b["path"], ctypes.string_at(p, b["nbytes"]))
    if rc != 0:
        raise Failed(spec["entry"], rc)
    return {}


class _ModelApi:
    """The C API (blockc_model.h), typed for ctypes, and the steps both
    ``call_model`` and ``call_session`` take with it; each failure raises
    Failed with the library's own message (the calling thread's last error,
    or the model's)."""

    def __init__(self, lib):
        vp, size = ctypes.c_void_p, ctypes.c_size_t
        dims_type = ctypes.POINTER(ctypes.c_longlong)
        self._create = _function(lib, "blockc_create", vp, [ctypes.c_char_p])
        self._last_error = _function(lib, "blockc_last_error", ctypes.c_char_p, [])
        self._model_error = _function(lib, "blockc_model_error", ctypes.c_char_p, [vp])
        self._alloc = _function(lib, "blockc_device_alloc", vp, [size])
        self.free = _function(lib, "blockc_device_free", None, [vp])
        self._to_device = _function(lib, "blockc_copy_to_device", ctypes.c_int, [vp, vp, size])
        self._to_host = _function(lib, "blockc_copy_to_host", ctypes.c_int, [vp, vp, size])
        self._reserve = _function(lib, "blockc_reserve", ctypes.c_int, [vp, dims_type])
        self._run = _function(lib, "blockc_run", ctypes.c_int,
                              [vp, ctypes.POINTER(vp), ctypes.POINTER(vp), dims_type, vp])
        self._sync = _function(lib, "blockc_synchronize", ctypes.c_int, [])
        self.destroy = _function(lib, "blockc_destroy", None, [vp])

    def check(self, where: str, rc: int) -> None:
        if rc != 0:
            raise Failed(where, rc, self._last_error().decode(errors="replace"))

    def _model_failed(self, model, where: str, rc: int) -> None:
        if rc != 0:   # the model keeps why its call failed
            raise Failed(where, rc, self._model_error(model).decode(errors="replace"))

    def create(self, weights: str):
        model = self._create(weights.encode())
        if not model:
            raise Failed("blockc_create", 1, self._last_error().decode(errors="replace"))
        return model

    def buffer(self, nbytes: int):
        """A device buffer of ``nbytes`` (at least one byte); the caller frees it."""
        p = self._alloc(max(nbytes, 1))
        if not p:
            raise Failed("blockc_device_alloc", 2, "device allocation of %d bytes failed" % nbytes)
        return p

    def upload(self, path: str):
        """A new device buffer holding the file at ``path``; the caller frees it."""
        data = _read(path)
        p = self.buffer(len(data))
        self.check("blockc_copy_to_device", self._to_device(p, ctypes.create_string_buffer(data, len(data)), len(data)))
        return p

    def download(self, p, path: str, nbytes: int) -> None:
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        self.check("blockc_copy_to_host", self._to_host(buf, p, nbytes))
        _write(path, buf.raw[:nbytes])

    def reserve(self, model, dims) -> None:
        self._model_failed(model, "blockc_reserve", self._reserve(model, longs(dims)))

    def runner(self, model, ins: list, outs: list, dims: list):
        """A call that runs ``model`` once on these device buffers, its
        arguments made once (what a timing loop calls)."""
        vp = ctypes.c_void_p
        in_arr, out_arr = (vp * max(len(ins), 1))(*ins), (vp * max(len(outs), 1))(*outs)
        dims = longs(dims)
        return lambda: self._model_failed(model, "blockc_run", self._run(model, in_arr, out_arr, dims, None))

    def synchronize(self) -> None:
        self.check("blockc_synchronize", self._sync())


def longs(values):
    return (ctypes.c_longlong * max(len(values), 1))(*values)


def call_model(lib, spec: dict) -> dict:
    api = _ModelApi(lib)
    model = api.create(spec["weights"])
    device, events = [], []
    try:
        api.reserve(model, spec.get("reserve") or spec["dims"])
        ins = []
        for item in spec["inputs"]:
            device.append(api.upload(item["path"]))
            ins.append(device[-1])
        outs = []
        for item in spec["outputs"]:
            if "alias" in item:
                outs.append(ins[item["alias"]])
            else:
                device.append(api.buffer(item["nbytes"]))
                outs.append(device[-1])
        run_once = api.runner(model, ins, outs, spec["dims"])

        result = {}
        counted = _counters(lib)
        if spec.get("time"):
            timing = _timing_module(spec["timing_module"])
            t = spec["time"]
            result["times"] = timing.measure(run_once, warmup=int(t["warmup"]), min_repeats=int(t["min_repeats"]),
                                             min_time_s=float(t["min_time_s"]),
                                             runs_per_sample=int(t.get("runs_per_sample", 1)),
                                             clock=_event_clock(lib, timing, events, api.check)).samples
        else:
            for _ in range(int(spec.get("runs", 1))):
                run_once()
        api.synchronize()
        if counted is not None:
            result["counters"] = {k: v - counted[k] for k, v in _counters(lib).items()}
        for item, p in zip(spec["outputs"], outs):
            api.download(p, item["path"], item["nbytes"])
        return result
    finally:
        for e in events:
            lib.blockc_event_destroy(e)
        for p in device:
            api.free(p)
        api.destroy(model)


def call_session(lib, spec: dict) -> dict:
    api = _ModelApi(lib)

    def answer(reply: dict) -> None:
        sys.stdout.write("blockc-session " + json.dumps(reply) + "\n")
        sys.stdout.flush()

    model = api.create(spec["weights"])
    carry = {int(o): int(i) for o, i in spec["carry"].items()}      # output position -> input position
    state = {}
    try:
        for i, path in spec["state"].items():
            state[int(i)] = api.upload(path)
        reserved = [0] * len(spec["reserve"])
        answer({"ok": True, "addresses": {str(i): p for i, p in state.items()}})
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "close":
                break
            temporary = []
            try:
                if command["op"] == "read":
                    api.synchronize()
                    api.download(state[int(command["input"])], command["path"], command["nbytes"])
                    answer({"ok": True})
                    continue
                dims = command["dims"]
                if any(d > r for d, r in zip(dims, reserved)):   # reserve more, never less
                    reserved = [max(d, r) for d, r in zip(dims, reserved)]
                    api.reserve(model, reserved)
                ins = []
                for k, path in enumerate(command["inputs"]):
                    if k not in state:
                        temporary.append(api.upload(path))
                    ins.append(state[k] if k in state else temporary[-1])
                outs = []
                for k, item in enumerate(command["outputs"]):
                    if k not in carry:
                        temporary.append(api.buffer(item["nbytes"]))
                    outs.append(state[carry[k]] if k in carry else temporary[-1])
                counted = _counters(lib)   # what this run does, not the session so far
                api.runner(model, ins, outs, dims)()
                api.synchronize()
                for k, item in enumerate(command["outputs"]):
                    if k not in carry:
                        api.download(outs[k], item["path"], item["nbytes"])
                reply = {"ok": True}
                if counted is not None:
                    reply["counters"] = {k: v - counted[k] for k, v in _counters(lib).items()}
                answer(reply)
            except Failed as e:
                answer({"ok": False, "rc": e.rc, "where": e.where, "error": e.error})
            finally:
                for p in temporary:
                    api.free(p)
    finally:
        for p in state.values():
            api.free(p)
        api.destroy(model)
    return {}


def _event_clock(lib, timing, events: list, check):
    """``timing.event_clock`` on the library's CUDA events, recorded on the
    stream the runs use (the legacy default stream); ``events`` keeps them
    for the caller to destroy."""
    vp = ctypes.c_void_p
    create = _function(lib, "blockc_event_create", vp, [])
    record = _function(lib, "blockc_event_record", ctypes.c_int, [vp, vp])
    seconds = _function(lib, "blockc_event_seconds", ctypes.c_int, [vp, vp, ctypes.POINTER(ctypes.c_double)])
    _function(lib, "blockc_event_destroy", None, [vp])   # declared for call_model's cleanup
    for _ in range(2):
        events.append(create())
        if not events[-1]:
            raise Failed("blockc_event_create", 1, "cannot create a CUDA event")
    start, end = events[-2:]
    elapsed = ctypes.c_double()

    def stop() -> float:
        check("blockc_event_record", record(end, None))
        check("blockc_event_seconds", seconds(start, end, ctypes.byref(elapsed)))
        return elapsed.value

    return timing.event_clock(lambda: check("blockc_event_record", record(start, None)), stop)


def _counters(lib):
    """What an emulated library's emulator has counted so far; None on a GPU."""
    fn = getattr(lib, "blockc_emu_counters", None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]
    buf = ctypes.create_string_buffer(1024)
    fn(buf, len(buf))
    return json.loads(buf.value.decode())


def _timing_module(path: str):
    spec = importlib.util.spec_from_file_location("blockc_child_timing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    lib = ctypes.CDLL(spec["so"])
    try:
        result = {"entry": call_entry, "model": call_model, "session": call_session}[spec["call"]](lib, spec)
        result.update(rc=0, where="", error="")
    except Failed as e:
        result = {"rc": e.rc, "where": e.where, "error": e.error}
    sys.stderr.flush()
    with open(spec["result"], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
