"""The CuPy launcher: without CuPy a CUDA tensor names the extra to install; with a stand-in
CuPy each instantiation compiles once and its arguments are packed as the kernel declares
them; on a GPU the CuPy kernels match the CPU path."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import oplib.kernels
from oplib import registry
from oplib.kernels import NVRTC_OPTIONS, cuda_launch, load_source
from oplib.kernels.cuda_source import cuda_sources
from oplib.kernels.involution import cuda as involution_cuda

from cuda_test_helpers import LAUNCHES, random_samples


def test_cuda_tensors_without_cupy_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(RuntimeError, match=r"pip install 'torch-oplib\[cuda12\]' or 'torch-oplib\[cuda13\]'"):
        oplib.kernels.CuPyLauncher()


class _FakeDriver:
    """cupy_backends' driver module, as far as CuPyLauncher uses it, recording launches."""

    def __init__(self):
        self.context = 7
        self.contexts_set = []
        self.launches = []

    def ctxGetCurrent(self):
        return self.context

    def ctxSetCurrent(self, context):
        self.contexts_set.append(context)
        self.context = context

    def launchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        import ctypes

        count = len(self.expected_arguments)
        pointers = (ctypes.c_void_p * count).from_address(params)
        values = [ctypes.c_int64.from_address(pointer).value for pointer in pointers]
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra, self.context))


class _FakeCupy:
    """The parts of cupy that CuPyLauncher uses: RawModule (recording what it compiles) and Device."""

    def __init__(self, driver: _FakeDriver):
        self.compiled: list[list[str]] = []
        self.devices_entered: list[int] = []
        fake = self

        class RawModule:
            def __init__(self, code, options, name_expressions):
                self.names = list(name_expressions)
                assert tuple(options) == NVRTC_OPTIONS and code == load_source(involution_cuda.SOURCE).text

            def compile(self):
                fake.compiled.append(self.names)

            def get_function(self, name):  # a RawKernel, whose `kernel` is a cupy.cuda.function.Function
                handle = 1000 + self.names.index(name) + 100 * len(fake.compiled)
                return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=handle))

        class Device:
            def __init__(self, index):
                self.index = index

            def __enter__(self):
                fake.devices_entered.append(self.index)
                driver.context = 7  # the device's primary context becomes current

            def __exit__(self, *exc):
                return False

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=Device)


def test_the_fake_cupy_has_the_real_cupys_shape():
    """The recording test below stands in for CuPy; the attributes it offers must be CuPy's own,
    or the launcher passes here and fails on a GPU (as it did: a RawKernel has no `ptr`)."""
    cupy = pytest.importorskip("cupy")
    from cupy._core.raw import RawKernel
    from cupy.cuda.function import Function

    assert callable(cupy.RawModule.get_function) and callable(cupy.RawModule.compile)
    assert "kernel" in dir(RawKernel) and "ptr" not in dir(RawKernel)
    assert "ptr" in dir(Function)
    driver = pytest.importorskip("cupy_backends.cuda.api.driver")
    assert callable(driver.ctxGetCurrent) and callable(driver.launchKernel)
    # (the occupancy test's driver: func, blockSize, dynamicSMemSize -> blocks)
    assert "blockSize" in driver.occupancyMaxActiveBlocksPerMultiprocessor.__doc__


def test_cupy_launcher_compiles_each_instantiation_once_and_packs_its_arguments(monkeypatch):
    """The launch path without a GPU, against a recording driver: each instantiation compiles
    on its first launch only (as its own module), the arguments reach cuLaunchKernel as the
    8-byte values the kernel's parameters are (pointers and index_t), on PyTorch's current
    stream, and the device is entered only when the thread's current context is not its own."""
    driver = _FakeDriver()
    fake_cupy = _FakeCupy(driver)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.api", types.SimpleNamespace(driver=driver))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=4242))
    # CPU tensors stand in for a GPU's (their pointers are only recorded); the real check refuses them
    monkeypatch.setattr(cuda_launch, "launch_device", lambda kernel, args: None)
    launcher = oplib.kernels.CuPyLauncher()
    x, w = torch.randn(1, 16, 9, 9), torch.randn(1, 1, 7, 7, 9, 9)
    out = torch.empty(1, 16, 9, 9)
    source = load_source(involution_cuda.SOURCE)
    args = (x, w, out, 81, 16, 9, 9, 1, 9, 9, 3, 3, 16)
    driver.expected_arguments = args
    specialisation = ("int", "7", "1", "false")
    config = oplib.kernels.linear_config(1)
    for _ in range(3):
        launcher.launch(source, "involution_forward_chunked", torch.float32, config, args, specialisation)
    assert fake_cupy.compiled == [["involution_forward_chunked<float, int, 7, 1, false>"]]
    assert fake_cupy.devices_entered == [None]  # the compile; the launches found the context current
    (function, grid, block, shared, stream, values, extra, context), *rest = driver.launches
    assert len(rest) == 2 and all(launch == driver.launches[0] for launch in rest)
    assert (grid, block, shared, stream, extra) == ((1, 1, 1), (256, 1, 1), 0, 4242, 0)
    assert values == [x.data_ptr(), w.data_ptr(), out.data_ptr(), 81, 16, 9, 9, 1, 9, 9, 3, 3, 16]
    # Another device's context current, or none (a thread that never used CUDA: autograd's): the
    # launch makes the tensors' device's context current, then gives the thread its own back.
    for other in (99, 0):
        driver.context, driver.contexts_set = other, []
        launcher.launch(source, "involution_forward_chunked", torch.float32, config, args, specialisation)
        assert driver.launches[-1][-1] == 7 and driver.contexts_set == [7, other] and driver.context == other
    assert fake_cupy.devices_entered == [None]
    # Another dtype is another instantiation: compiled on its first launch.
    args = (x.double(), w.double(), out.double(), *args[3:])
    driver.expected_arguments = args
    launcher.launch(source, "involution_forward_chunked", torch.float64, config, args, specialisation)
    assert fake_cupy.compiled[-1] == ["involution_forward_chunked<double, int, 7, 1, false>"]


def test_the_occupancy_is_the_drivers_for_the_compiled_instantiation(monkeypatch):
    """A launch policy that weighs the GPU's occupancy (the staged forward's tiles) gets the
    driver's occupancy calculator's answer for the instantiation, compiled if it must be, with
    its context current and, above 48 KiB, its dynamic shared memory opted into first (past the
    function's limit the driver answers 0), and the GPU's SMs; a tensor off a GPU gets None."""
    driver = _FakeDriver()
    driver.asked, driver.attributes = [], []

    def occupancy(function, threads, shared_bytes):
        driver.asked.append((function, threads, shared_bytes, driver.context))
        return 3

    driver.occupancyMaxActiveBlocksPerMultiprocessor = occupancy
    driver.funcSetAttribute = lambda function, attribute, value: driver.attributes.append((function, attribute, value))
    fake_cupy = _FakeCupy(driver)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.api", types.SimpleNamespace(driver=driver))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(
        multi_processor_count=132 + index, shared_memory_per_block_optin=227 * 1024))
    launcher = oplib.kernels.CuPyLauncher()
    source = load_source(involution_cuda.SOURCE)

    def ask(shared_bytes, device=torch.device("cuda", 0)):
        return launcher.occupancy(source, "involution_forward_chunked", torch.float32, ("int", "7", "1", "false"),
                                  device, 256, shared_bytes)

    assert ask(1024) == (3, 132)
    assert fake_cupy.compiled == [["involution_forward_chunked<float, int, 7, 1, false>"]]
    function = driver.asked[0][0]
    assert driver.asked == [(function, 256, 1024, 7)] and driver.attributes == []
    driver.context, driver.contexts_set = 99, []  # another device's context current: 7 made current, 99 given back
    assert ask(60 * 1024) == (3, 132) and fake_cupy.compiled == [["involution_forward_chunked<float, int, 7, 1, false>"]]
    assert driver.attributes == [(function, cuda_launch._MAX_DYNAMIC_SHARED_ATTRIBUTE, 60 * 1024)]
    assert driver.asked[-1] == (function, 256, 60 * 1024, 7) and driver.contexts_set == [7, 99] and driver.context == 99
    assert ask(1024, torch.device("cpu")) is None and len(driver.asked) == 2


@pytest.mark.parametrize("devices", [("cpu", "cpu", "cpu"), ("cpu", "meta", "cpu")], ids=["cpu", "mixed"])
def test_a_launch_refuses_tensors_off_one_cuda_device(monkeypatch, devices):
    """A CPU tensor's pointer handed to a kernel is read as device memory: on an H200 a test
    that built grad_output on the CPU got an illegal address from the tensor-core grad_input
    (compute-sanitizer: a read 139 TB below every allocation, bench/results/h200/draw5/followup/)
    and poisoned its process's context, failing 140 tests after it. The launch now refuses
    before anything reaches the driver."""
    driver = _FakeDriver()
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(driver))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.api", types.SimpleNamespace(driver=driver))
    launcher = oplib.kernels.CuPyLauncher()
    x, w, out = (torch.empty(shape, device=device) for shape, device in
                 zip([(1, 16, 9, 9), (1, 1, 7, 7, 9, 9), (1, 16, 9, 9)], devices))
    args = (x, w, out, 81, 16, 9, 9, 1, 9, 9, 3, 3, 16)
    with pytest.raises(ValueError, match=r"involution_forward_chunked: every tensor must be on one CUDA device"):
        launcher.launch(load_source(involution_cuda.SOURCE), "involution_forward_chunked", torch.float32,
                        oplib.kernels.linear_config(1), args, ("int", "7", "1", "false"))
    assert driver.launches == []


@pytest.mark.needs_cuda
@pytest.mark.parametrize("dtype", registry.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAUNCHES))
def test_cupy_kernels_match_the_cpu_path(name, dtype):
    spec = registry.get(name)
    for sample in [*spec.sample_inputs("cuda", dtype, False), *random_samples(spec, dtype, 20, seed=3)]:
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in sample.args]
        cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in sample.args]
        atol, rtol = spec.tolerance(dtype)
        torch.testing.assert_close(spec.op(*args).cpu(), spec.op(*cpu_args), atol=atol, rtol=rtol, msg=sample.name)


@pytest.mark.needs_cuda
def test_a_launch_from_a_thread_with_no_cuda_context():
    """A thread that never used CUDA has no current context (autograd's backward thread is one):
    the launch must make the device's context current there, and give the thread its own back.
    Before, cupy.cuda.Device saw device 0 "current", set nothing, and cuLaunchKernel raised
    CUDA_ERROR_INVALID_CONTEXT (gradcheck of involution_generated on an H200)."""
    import threading

    from cupy_backends.cuda.api import driver

    from oplib.kernels import cupy_launcher

    x = torch.randn(2, 16, 9, 9, device="cuda")
    w = torch.randn(2, 1, 7, 7, 9, 9, device="cuda")
    expected = torch.ops.oplib.involution(x, w, [1, 1], [3, 3], [1, 1])
    out = torch.full_like(expected, float("nan"))
    seen = {}

    def launch_in_fresh_thread():
        seen["context before"] = driver.ctxGetCurrent()
        try:
            involution_cuda.involution(x, w, [1, 1], [3, 3], [1, 1], out, cupy_launcher())
        except Exception as error:  # reported on the test's thread
            seen["error"] = error
        seen["context after"] = driver.ctxGetCurrent()

    thread = threading.Thread(target=launch_in_fresh_thread)
    thread.start()
    thread.join()
    assert seen["context before"] == 0, "the premise: a new thread starts with no CUDA context"
    assert "error" not in seen, seen.get("error")
    assert seen["context after"] == 0
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected)


def test_load_loads_every_source_a_dispatch_launches_from(monkeypatch):
    """``oplib.kernels.load("cuda")`` loads each source whose kernels an op's CUDA dispatch may
    launch: the fused forward's tile and tensor-core sources, involution_vectors.cu,
    involution_last.cu (grad_weight's, under the ``LAST`` policy) and dense_window.cu
    (grad_weight's, under the ``dense_window`` policy) too. It
    loaded one source a dispatch before, so those compiled at their first call (inside a CUDA
    graph capture, say)."""
    loaded = []
    fake = types.SimpleNamespace(load=lambda source, index: loaded.append(source.path.name))
    monkeypatch.setattr(cuda_launch, "cupy_launcher", lambda: fake)
    oplib.kernels.load("cuda:0")
    assert set(loaded) == {"involution.cu", "involution_generated.cu", "involution_vectors.cu", "span_tile.cu",
                           "generated_mma.cu", "involution_last.cu", "dense_window.cu"}
    assert len(loaded) == len(set(loaded))
    launched_from = {kernel: source for source in map(load_source, cuda_sources())
                     for kernel in source.kernels}
    for dispatch in oplib.kernels.CUDA_DISPATCH.values():
        assert {launched_from[kernel].path.name for kernel in dispatch.kernels} <= set(loaded), dispatch.qualname
