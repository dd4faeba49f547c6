"""involution's CUDA backend: the launches of ``involution.cu`` (involution and its two
backward ops), ``involution_generated.cu`` (the fused-generation op and its grad_input, generic
kernels), and the tiled kernels: ``span_tile.cu`` (the span conv, the tiled fused forward) and
``generated_mma.cu`` (the fused forward and grad_input on tensor cores); and
``involution_vectors.cu`` (involution's NCHW forward, stride-1 grad_input and grad_weight, a
vector of pixels a lane). involution's three ops take ``involution_vectors.cu``'s kernel where
it serves the call (contiguous NCHW, widths a multiple of its vector), else the chunked one where
one serves the window, else the generic one: on the sixth H200 draw
(bench/results/h200/draw6/involution-cuda.md) the vectors kernels took 0.39x-0.81x of the
chunked kernels' device time at every RedNet-50 row they serve, and they give the same bits.
The fused forward's op
takes the tensor-core or the tiled kernel where one serves the call (``involution_generated``).
Its grad_input's op goes through the weight map, as the unfused path does: the span conv writes
it and involution's grad_input kernels read it (``involution_generated_backward_input``). The
tensor-core grad_input is not that op's default: on the fifth H200 draw it was slower than the
map route; neither is the generic kernel, several times slower than either on the sixth.

Each function writes the op's result into ``out``, which the op allocated in its fake's layout
(``layouts``), through a launcher: CuPy's on a GPU (the default), the host emulation of
``oplib.testing.cuda_emulation`` in the tests. Which kernel serves a call, and how it is
launched, is a ``LaunchPolicy``: its facts are read from the ``.cu`` source, so benches and
tests pass a changed policy (``dataclasses.replace``) instead of patching module globals.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..cuda_launch import BLOCK_SIZE, MAX_BLOCKS, LaunchConfig, Launcher, cuda_dispatch, cupy_launcher, launch_elementwise
from ..cuda_source import KernelSource, load_source
from .cpu import _accumulation_dtype, contract_generator_map_into, generated_weight, generator_grads_through_map
from .layouts import activation_in, is_channels_last, is_pixel_major, result_like, weight_in, weight_result

SOURCE = "involution/csrc/cuda/involution.cu"
GENERATED_SOURCE = "involution/csrc/cuda/involution_generated.cu"
VECTORS_SOURCE = "involution/csrc/cuda/involution_vectors.cu"
SPAN_TILE_SOURCE = "involution/csrc/cuda/span_tile.cu"
GENERATED_MMA_SOURCE = "involution/csrc/cuda/generated_mma.cu"
LAST_SOURCE = "involution/csrc/cuda/involution_last.cu"
# Small maps a block holds whole, each (sample, group) one tensor-core product (its section below).
DENSE_WINDOW_SOURCE = "involution/csrc/cuda/dense_window.cu"


@dataclass(frozen=True)
class LaunchPolicy:
    """How the host chooses and launches ``involution.cu``'s kernels.

    ``kernel_sizes``, ``strides``: the square kernels and equal strides (dilation 1) the
    specialised ("chunked": a thread owns a chunk of a group's channels) kernels serve, from
    the source's ``oplib-template`` lines; any other geometry runs the generic kernels. ``max_channels``: a chunked thread's accumulators, for 8-
    and for 2/4-byte values (``CHUNK_MAX_CHANNELS*``). ``vector_bytes``: what a channels_last
    kernel moves at once (``VECTOR_BYTES``). ``index32_limit``: the 32-bit-offset kernels serve
    tensors up to this many elements, so that a grid-stride index stays below 2^31 even one
    whole grid past the last element. ``target_threads``: channels per thread trade weight
    reuse (more) against parallelism (fewer); the most channels that still leave this many
    threads (a guess for an H100, 132 SMs of 2048 threads, until make gpu-check measures it).
    ``vectors``: the NCHW calls ``involution_vectors.cu`` serves go to its kernels (False: to the
    chunked kernels, as ``CHUNKED``, which the benches time beside them and the chunked kernels'
    own tests use). ``lanes_on_channels``: channels_last calls give a lane one 16-byte vector
    of a group's channels, DCNv4's mapping (``LAST``): ``involution_last.cu``'s kernels where
    they serve the call, else the chunked kernels at one vector a thread (not the most
    channels that keep ``target_threads``); off until a GPU draw has timed them beside the
    chunked kernels as they run now (the kernel table's "lanes on channels" column).
    ``grad_input_segments``: under ``lanes_on_channels``, a channels_last grad_input takes
    ``involution_last.cu``'s segment kernel where it serves the call (False: the chunked kernel
    at one vector a thread, as ``LAST_VECTOR_GRAD_INPUT``, which the kernel table times beside it
    until a draw has chosen between them). ``dense_window``: a 16-bit grad_weight on a map that
    ``dense_window.cu``'s grad_weight kernel holds (RedNet-50's last stage) goes to it (a
    (sample, group) a block, the products on tensor cores), and the fused op's generator
    gradients take the map it writes in float32 (``generator_grads_through_dense_map``); off
    until a draw has timed it beside the kernels the op takes now (the kernel table's "dense
    window" column of the grad_weight and generator grads rows). ``last_pixels``: the output
    pixels of a row a lane of ``involution_last.cu``'s forward and grad_weight takes, 1 or 2;
    None: chosen by the GPU's occupancy (``last_pixels``). ``vectors_wide``: whether
    ``involution_vectors.cu``'s forward takes ``VECTORS_WIDE_FACTOR`` times its channels a thread
    (its WIDE instantiations); None: where the GPU's build of them keeps everything in registers
    and as many blocks resident as the narrow ones' (``vectors_wide``).
    """

    kernel_sizes: tuple[int, ...]
    strides: tuple[int, ...]
    max_channels: int
    max_channels_8_byte: int
    vector_bytes: int
    index32_limit: int = 2**31 - 1 - MAX_BLOCKS * BLOCK_SIZE
    target_threads: int = 1 << 17
    vectors: bool = True
    lanes_on_channels: bool = False
    grad_input_segments: bool = True
    dense_window: bool = False
    last_pixels: Optional[int] = None
    vectors_wide: Optional[bool] = None

    @classmethod
    def from_source(cls, source: KernelSource) -> LaunchPolicy:
        values, constants = source.template_values, source.constants
        return cls(
            kernel_sizes=tuple(int(v) for v in values["KERNEL"]),
            strides=tuple(int(v) for v in values["STRIDE"]),
            max_channels=constants["CHUNK_MAX_CHANNELS"],
            max_channels_8_byte=constants["CHUNK_MAX_CHANNELS_8_BYTE"],
            vector_bytes=constants["VECTOR_BYTES"],
        )

    def specialisation(self, kernel_size, stride, dilation, channels_last: bool, *tensors: Tensor):
        """The template arguments after scalar_t of the chunked kernel for this geometry, or None
        when only the generic kernel serves it."""
        kh, kw = kernel_size
        if kh != kw or kh not in self.kernel_sizes or stride[0] != stride[1] or stride[0] not in self.strides:
            return None
        if tuple(dilation) != (1, 1):
            return None
        offset = "int" if max(t.numel() for t in tensors) <= self.index32_limit else "long long"
        return (offset, str(kh), str(stride[0]), "true" if channels_last else "false")

    def lanes(self, dtype: torch.dtype) -> int:
        """Elements of ``dtype`` in one vector."""
        return self.vector_bytes // dtype.itemsize

    def vectors_fit(self, channels: int, per_group: int, *tensors: Tensor) -> bool:
        """Whether the channels_last kernels' vectors fit: each pixel's channels and each group's
        start at a multiple of the vector, from aligned tensors."""
        lanes = self.lanes(tensors[0].dtype)
        aligned = all(t.data_ptr() % self.vector_bytes == 0 for t in tensors)
        return channels % lanes == 0 and per_group % lanes == 0 and aligned

    def channels_per_thread(self, per_group: int, threads_per_channel: int, dtype: torch.dtype, multiple: int) -> int:
        """The most channels (a divisor of ``per_group``, a multiple of ``multiple``) a thread can
        own while the launch keeps ``target_threads`` threads; the fewest when none can."""
        most = self.max_channels_8_byte if dtype.itemsize == 8 else self.max_channels
        candidates = [d for d in range(most, 0, -1) if per_group % d == 0 and d % multiple == 0]
        for count in candidates:
            if threads_per_channel * (per_group // count) >= self.target_threads:
                return count
        return candidates[-1]


POLICY = LaunchPolicy.from_source(load_source(SOURCE))
# The chunked kernels wherever they serve, with none of involution_vectors.cu's.
CHUNKED = dataclasses.replace(POLICY, vectors=False)
# The ops' policy with involution_vectors.cu's forward at its channels a thread fixed, whatever
# the GPU's build of its WIDE instantiations (``vectors_wide``): what the kernel table times side
# by side.
VECTORS_NARROW = dataclasses.replace(POLICY, vectors_wide=False)
VECTORS_WIDE = dataclasses.replace(POLICY, vectors_wide=True)
# The ops' policy with a lane a vector of a group's channels in every channels_last call.
LAST = dataclasses.replace(POLICY, lanes_on_channels=True)
# ``LAST`` with channels_last grad_input on the chunked kernel at one vector a thread: the two
# grad_input candidates, which the kernel table times side by side until a draw chooses.
LAST_VECTOR_GRAD_INPUT = dataclasses.replace(LAST, grad_input_segments=False)
# ``LAST`` with a lane's pixels fixed in involution_last.cu's forward and grad_weight, two or one,
# whatever the GPU's occupancy (``last_pixels``): what the kernel table times side by side.
LAST_PAIRS = dataclasses.replace(LAST, last_pixels=load_source(LAST_SOURCE).constants["LAST_PAIR_PIXELS"])
LAST_ONE_PIXEL = dataclasses.replace(LAST, last_pixels=1)


def _in_layout(out: Tensor, last: bool, weight: bool = False) -> bool:
    """Whether ``out`` is laid out as a kernel writes it: contiguous, or (``last``) channels_last
    (an activation) or pixel-major (a weight)."""
    if not last:
        return out.is_contiguous()
    return is_pixel_major(out) if weight else out.is_contiguous(memory_format=torch.channels_last)


def _run(launcher: Launcher, kernel: str, out: Tensor, writes_out: bool, operands: tuple, scalars: tuple,
         threads: Optional[int] = None, specialisation: tuple = (), source: str = SOURCE) -> Tensor:
    """Launch ``kernel`` of ``source`` (operands, then its result, then the scalars) into ``out``
    when ``writes_out`` (the kernel writes ``out``'s layout), else into a contiguous buffer then
    copied into ``out``."""
    result = out if writes_out else out.new_empty(out.shape)
    launch_elementwise(launcher, load_source(source), kernel, result, (*operands, result, *scalars), threads,
                       specialisation)
    return out if result is out else out.copy_(result)


def _window_scalars(channels, height, width, weight_shape, stride, padding, dilation) -> tuple:
    """The generic kernels' trailing arguments, in their order."""
    _, groups, kh, kw, out_h, out_w = weight_shape
    return (channels, height, width, groups, kh, kw, out_h, out_w, *stride, *padding, *dilation)


def _run_generic(launcher: Launcher, kernel: str, out: Tensor, operands: tuple, scalars: tuple) -> Tensor:
    """A generic kernel: contiguous operands, one thread per element of its contiguous result."""
    operands = tuple(operand.contiguous() for operand in operands)
    return _run(launcher, kernel, out, out.is_contiguous(), operands, (out.numel(), *scalars))


def _channel_chunked(kernel: str, activation: Tensor, weight: Tensor, stride, padding, dilation, out: Tensor,
                   launcher: Optional[Launcher], policy: Optional[LaunchPolicy]) -> Tensor:
    """The forward (``kernel`` "involution_forward") or grad_input ("involution_backward_input"):
    each reads an activation (input or grad_output) and the weight and writes the activation
    ``out``; the chunked kernel where one serves the geometry, one thread per pixel and chunk of a
    group's channels, else the generic one."""
    launcher, policy = launcher or cupy_launcher(), policy or POLICY
    n, channels = activation.shape[:2]
    groups, kh, kw, out_h, out_w = weight.shape[1:]
    out_size = tuple(out.shape[2:])
    # The kernels' scalars name the input's size and the output's, whichever of them is read.
    height, width = out_size if kernel == "involution_backward_input" else activation.shape[2:]
    per_group = channels // groups
    layout_last = is_channels_last(activation) and policy.vectors_fit(channels, per_group, activation, out)
    specialisation = policy.specialisation((kh, kw), stride, dilation, layout_last, activation, weight, out)
    if specialisation is None:
        scalars = _window_scalars(channels, height, width, weight.shape, stride, padding, dilation)
        return _run_generic(launcher, kernel, out, (activation, weight), scalars)
    activation, weight = activation_in(activation, layout_last), weight_in(weight, layout_last)
    lanes = policy.lanes(activation.dtype) if layout_last else 1
    per_thread = (lanes if layout_last and policy.lanes_on_channels else
                  policy.channels_per_thread(per_group, n * groups * out_size[0] * out_size[1], activation.dtype, lanes))
    threads = n * groups * (per_group // per_thread) * out_size[0] * out_size[1]
    scalars = (threads, channels, height, width, groups, out_h, out_w, *padding, per_thread)
    return _run(launcher, f"{kernel}_chunked", out, _in_layout(out, layout_last), (activation, weight), scalars, threads,
                specialisation)


def involution(input: Tensor, weight: Tensor, stride, padding, dilation, out: Tensor,
               launcher: Optional[Launcher] = None, policy: Optional[LaunchPolicy] = None) -> Tensor:
    """input: (N, C, H, W), weight: (N, G, KH, KW, Ho, Wo) -> out: (N, C, Ho, Wo)."""
    policy = policy or POLICY
    if policy.vectors and involution_vectors(input, weight, stride, padding, dilation, out, launcher,
                                             policy) is not None:
        return out
    if policy.lanes_on_channels and involution_last(input, weight, stride, padding, dilation, out,
                                                    launcher, policy) is not None:
        return out
    return _channel_chunked("involution_forward", input, weight, stride, padding, dilation, out, launcher, policy)


# ---------------------------------------------------------------------------------------
# involution's NCHW kernels with a vector of pixels a lane (involution_vectors.cu): the ops'
# first choice (involution, involution_backward_input, involution_backward_weight above)
# ---------------------------------------------------------------------------------------



def vectors_specialisation(source: KernelSource, kernel_size, stride, dilation) -> Optional[tuple[str, str]]:
    """The (KERNEL, STRIDE) instantiation of ``involution_forward_vectors`` (its WIDE argument
    after them) and ``involution_backward_weight_vectors`` for a window, or None where the source
    has none (non-square kernels or strides, dilation, other sizes)."""
    fixed = (str(kernel_size[0]), str(stride[0]))
    square = kernel_size[0] == kernel_size[1] and stride[0] == stride[1] and tuple(dilation) == (1, 1)
    return fixed if square and fixed in source.specialisations["involution_backward_weight_vectors"] else None


def vectors_pixels(source: KernelSource, dtype: torch.dtype) -> int:
    """Adjacent output pixels one lane of ``involution_forward_vectors`` owns (``Vectors::pixels``)."""
    return source.constants["VECTORS_PIXELS_8_BYTE" if dtype.itemsize == 8 else "VECTORS_PIXELS"]


def vectors_channels(source: KernelSource, dtype: torch.dtype, grad_input: bool = False, wide: bool = False) -> int:
    """Channels one thread of ``involution_forward_vectors`` owns (``Vectors::channels``; ``wide``:
    its WIDE instantiations', ``VECTORS_WIDE_FACTOR`` times as many), or of
    ``involution_backward_input_vectors`` (``Vectors::grad_input_channels``)."""
    channels = source.constants[f"VECTORS_{'GRAD_INPUT_' if grad_input else ''}CHANNELS_{dtype.itemsize}_BYTE"]
    return channels * (source.constants["VECTORS_WIDE_FACTOR"] if wide else 1)


def vectors_wide(launcher: Optional[Launcher], source: KernelSource, dtype: torch.dtype,
                 specialisation: tuple[str, ...], device: torch.device, policy: Optional[LaunchPolicy] = None) -> bool:
    """Whether ``involution_forward_vectors`` at the window ``specialisation`` takes its WIDE
    instantiation: ``policy.vectors_wide`` where set; else where the launcher's GPU builds it
    without local memory (the driver's ``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES``: ptxas kept its sums
    and weights in registers) and holds as many of its blocks at once as of the narrow one's (the
    driver's occupancy calculator); the narrow one where it spilled, where its registers cost a
    resident block, and where the launcher cannot tell (no ``local_bytes`` or no ``occupancy``:
    the recording and emulating launchers, whose launches are the GPU-less default).

    Why: a thread's more channels load and convert each kernel row's weights once for twice the
    multiply-adds (the offline model: 0.82x of the time in bfloat16, 0.77x in float32, at
    RedNet-50's first stage on an H200), but fill the registers two blocks an SM leave: ptxas
    spills them on some targets (its comment in involution_vectors.cu), and at a 3 x 3 window,
    whose three weights a row leave little to save, they leave sm_90 two blocks of the narrow
    one's three, and the model puts them slower (RedNet-50's stem in bfloat16)."""
    if policy is not None and policy.vectors_wide is not None:
        return policy.vectors_wide
    kernel, local_bytes = "involution_forward_vectors", getattr(launcher, "local_bytes", None)
    occupancies = [launch_occupancy(launcher, source, kernel, dtype, (*specialisation, width), device, BLOCK_SIZE)
                   for width in ("true", "false")]
    if local_bytes is None or occupancies[0] is None:
        return False
    if local_bytes(source, kernel, dtype, (*specialisation, "true"), device) != 0:
        return False
    wide, narrow = (occupancy(0) for occupancy in occupancies)
    return wide is not None and narrow is not None and wide[0] >= narrow[0]


def _vectors_window(source: KernelSource, kernel_size, stride, padding, dilation, tensors: tuple, width: int,
                    out_width: int) -> Optional[tuple[str, str]]:
    """The (KERNEL, STRIDE) instantiation of the forward's or grad_weight's kernel for a call, or
    None where they decline it: no instantiation, a horizontal padding other than K // 2, a
    tensor not contiguous or not aligned to the pixel vector, a width or output width not a
    multiple of it."""
    specialisation = vectors_specialisation(source, kernel_size, stride, dilation)
    if specialisation is None or padding[1] != kernel_size[1] // 2:
        return None
    pixels = vectors_pixels(source, tensors[0].dtype)
    vector_bytes = pixels * tensors[0].dtype.itemsize
    if not all(t.is_contiguous() and t.data_ptr() % vector_bytes == 0 for t in tensors):
        return None
    return None if width % pixels or out_width % pixels else specialisation


def taken_without_spills(source_name: str, kernel: str, specialisation: tuple[str, ...]) -> bool:
    """Whether the host launches this instantiation only where the GPU's build of it uses no
    local memory (``vectors_wide``: involution_vectors.cu's WIDE forward), so that ptxas spilling
    it on some target costs nothing there: the register-budget test lets it spill."""
    return source_name == VECTORS_SOURCE and kernel == "involution_forward_vectors" and specialisation[2] == "true"


def involution_vectors(input: Tensor, weight: Tensor, stride, padding, dilation, out: Tensor,
                       launcher: Optional[Launcher] = None, policy: Optional[LaunchPolicy] = None) -> Optional[Tensor]:
    """input: (N, C, H, W), weight: (N, G, K, K, Ho, Wo) -> out: (N, C, Ho, Wo), all contiguous
    (NCHW), by the kernel that gives a lane a vector of adjacent output pixels and a thread a
    fixed number of a group's channels (twice as many where ``vectors_wide`` takes its WIDE
    instantiation and a group's channels are a multiple); None, out untouched, where it declines: another
    layout, a window without an instantiation, a horizontal padding other than K // 2, a width
    or output width not a multiple of the vector, a pointer not aligned to it, a group's
    channels not a multiple of a thread's, or more work items than an int counts. The same bits as
    ``involution``'s kernels."""
    source = load_source(VECTORS_SOURCE)
    specialisation = _vectors_window(source, weight.shape[2:4], stride, padding, dilation, (input, weight, out),
                                     input.shape[3], out.shape[3])
    n, channels, height, width = input.shape
    groups, out_h, out_w = weight.shape[1], *out.shape[2:]
    pixels, per_thread = vectors_pixels(source, input.dtype), vectors_channels(source, input.dtype)
    if specialisation is None or (channels // groups) % per_thread:
        return None
    launcher = launcher or cupy_launcher()
    wide = (channels // groups) % vectors_channels(source, input.dtype, wide=True) == 0 and vectors_wide(
        launcher, source, input.dtype, specialisation, input.device, policy)
    per_thread = vectors_channels(source, input.dtype, wide=wide)
    threads = n * (channels // per_thread) * out_h * (out_w // pixels)
    if threads > POLICY.index32_limit:  # the kernel counts its work items in an int
        return None
    _run(launcher, "involution_forward_vectors", out, True, (input, weight),
         (threads, channels, height, width, groups, out_h, out_w, padding[0]), threads,
         (*specialisation, "true" if wide else "false"), VECTORS_SOURCE)
    return out


def involution_vectors_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation,
                                      out: Tensor, launcher: Optional[Launcher] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, K, K, Ho, Wo) -> out: grad_input (N, C, H, W),
    all contiguous (NCHW), at stride 1, by the kernel that gives a lane a vector of adjacent input
    pixels and a thread a fixed number of a group's channels; None, out untouched, where it
    declines (as ``involution_vectors``, and any stride but 1). The same bits as
    ``involution_backward_input``'s kernels."""
    source = load_source(VECTORS_SOURCE)
    kernel_size = weight.shape[2:4]
    square = kernel_size[0] == kernel_size[1] and tuple(dilation) == (1, 1) and tuple(stride) == (1, 1)
    if not square or (str(kernel_size[0]),) not in source.specialisations["involution_backward_input_vectors"]:
        return None
    pixels = vectors_pixels(source, grad_output.dtype)
    vector_bytes = pixels * grad_output.dtype.itemsize
    if padding[1] != kernel_size[1] // 2 or not all(t.is_contiguous() and t.data_ptr() % vector_bytes == 0
                                                    for t in (grad_output, weight, out)):
        return None
    n, channels, out_h, out_w = grad_output.shape
    groups, (height, width) = weight.shape[1], input_size
    per_thread = vectors_channels(source, grad_output.dtype, grad_input=True)
    if width % pixels or out_w != width or (channels // groups) % per_thread:
        return None
    threads = n * (channels // per_thread) * height * (width // pixels)
    if threads > POLICY.index32_limit:  # the kernel counts its work items in an int
        return None
    _run(launcher or cupy_launcher(), "involution_backward_input_vectors", out, True, (grad_output, weight),
         (threads, channels, height, width, groups, out_h, padding[0]), threads, (str(kernel_size[0]),),
         VECTORS_SOURCE)
    return out


def involution_vectors_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation,
                                       groups: int, out: Tensor, launcher: Optional[Launcher] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> out: grad_weight (N, G, K, K, Ho, Wo),
    all contiguous (NCHW), by the kernel that gives a lane a vector of adjacent output pixels and
    a thread one kernel row; None, out untouched, where it declines (the geometries and
    alignments ``involution_vectors`` declines). The same bits as ``involution_backward_weight``'s
    kernels."""
    source = load_source(VECTORS_SOURCE)
    specialisation = _vectors_window(source, kernel_size, stride, padding, dilation, (grad_output, input, out),
                                     input.shape[3], grad_output.shape[3])
    if specialisation is None:
        return None
    n, channels, height, width = input.shape
    out_h, out_w = grad_output.shape[2:]
    pixels = vectors_pixels(source, input.dtype)
    threads = n * groups * kernel_size[0] * out_h * (out_w // pixels)
    if threads > POLICY.index32_limit:  # the kernel counts its work items in an int
        return None
    _run(launcher or cupy_launcher(), "involution_backward_weight_vectors", out, True, (grad_output, input),
         (threads, channels, height, width, groups, out_h, out_w, padding[0]), threads, specialisation, VECTORS_SOURCE)
    return out


def involution_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation, out: Tensor,
                              launcher: Optional[Launcher] = None, policy: Optional[LaunchPolicy] = None) -> Tensor:
    """grad_output: (N, C, Ho, Wo), weight: (N, G, KH, KW, Ho, Wo) -> out: grad_input (N, C, H, W)."""
    policy = policy or POLICY
    if policy.vectors and involution_vectors_backward_input(
            grad_output, weight, input_size, stride, padding, dilation, out, launcher) is not None:
        return out
    if policy.lanes_on_channels and policy.grad_input_segments and involution_last_backward_input(
            grad_output, weight, input_size, stride, padding, dilation, out, launcher) is not None:
        return out
    return _channel_chunked("involution_backward_input", grad_output, weight, stride, padding, dilation, out, launcher,
                          policy)


def involution_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation, groups: int,
                               out: Tensor, launcher: Optional[Launcher] = None,
                               policy: Optional[LaunchPolicy] = None) -> Tensor:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> out: grad_weight (N, G, KH, KW, Ho, Wo)."""
    launcher, policy = launcher or cupy_launcher(), policy or POLICY
    if policy.dense_window and involution_dense_window_backward_weight(
            grad_output, input, kernel_size, stride, padding, dilation, groups, out, launcher) is not None:
        return out
    if policy.vectors and involution_vectors_backward_weight(grad_output, input, kernel_size, stride, padding, dilation,
                                                             groups, out, launcher) is not None:
        return out
    n, channels, height, width = input.shape
    out_h, out_w = grad_output.shape[2:]
    per_group = channels // groups
    # A grad_output in the other layout is copied into this one below, and a fresh copy is aligned.
    aligned = [input, grad_output] if is_channels_last(grad_output) else [input]
    layout_last = is_channels_last(input) and policy.vectors_fit(channels, per_group, *aligned)
    specialisation = policy.specialisation(kernel_size, stride, dilation, layout_last, grad_output, input, out)
    if specialisation is None:
        scalars = _window_scalars(channels, height, width, out.shape, stride, padding, dilation)
        return _run_generic(launcher, "involution_backward_weight", out, (grad_output, input), scalars)
    grad_output, input = activation_in(grad_output, layout_last), activation_in(input, layout_last)
    if policy.lanes_on_channels and layout_last and involution_last_backward_weight(
            grad_output, input, kernel_size, stride, padding, dilation, groups, out, launcher, policy) is not None:
        return out
    threads = n * groups * kernel_size[0] * out_h * out_w
    scalars = (threads, channels, height, width, groups, out_h, out_w, *padding)
    return _run(launcher, "involution_backward_weight_chunked", out, _in_layout(out, layout_last, weight=True),
                (grad_output, input), scalars, threads, specialisation)


def last_parts(source: KernelSource, channels: int, groups: int, dtype: torch.dtype) -> Optional[int]:
    """The lanes (16-byte vectors) that share a group's channels in ``involution_last.cu``, or
    None where the kernel declines the grouping: fewer than ``LAST_MIN_GROUP_CHANNELS`` channels
    a group, a group not a whole number of vectors, or vectors per group not a power of two up
    to ``LAST_MAX_PARTS``."""
    c = source.constants
    per_group = channels // groups
    if per_group < c["LAST_MIN_GROUP_CHANNELS"] or (per_group * dtype.itemsize) % c["VECTOR_BYTES"]:
        return None
    parts = per_group * dtype.itemsize // c["VECTOR_BYTES"]
    return parts if parts <= c["LAST_MAX_PARTS"] and parts & (parts - 1) == 0 else None


def _last_window(source: KernelSource, kernel_size, stride, dilation) -> Optional[tuple[str, str]]:
    """The (KERNEL, STRIDE) instantiation of ``involution_last.cu``'s kernels for a window (the
    forward's and grad_weight's take a lane's pixels after them), or None: non-square kernels or
    strides, dilation, sizes without one."""
    square = kernel_size[0] == kernel_size[1] and stride[0] == stride[1] and tuple(dilation) == (1, 1)
    specialisation = (str(kernel_size[0]), str(stride[0]))
    served = square and specialisation in source.specialisations["involution_backward_input_last"]
    return specialisation if served else None


def last_pixels(launcher: Optional[Launcher], source: KernelSource, kernel: str, dtype: torch.dtype,
                specialisation: tuple[str, ...], device: torch.device, pair_threads: int,
                policy: Optional[LaunchPolicy] = None) -> int:
    """The output pixels of a row a lane of ``kernel`` (``involution_last.cu``'s forward or
    grad_weight at the window ``specialisation``) takes: ``policy.last_pixels`` where set; else
    one where the grid of pairs (``pair_threads`` work items) is under ``LAST_PAIRS_MIN_WAVES``
    waves of the blocks the GPU holds at once (its occupancy calculator's, for the pairs'
    instantiation), so that the SMs it would leave idle take a second block; two where the
    grid fills them, or where the launcher cannot tell (no ``occupancy``: the recording and
    emulating launchers, whose launches are the GPU-less default).

    Why: a lane's two pixels share the K + S input vectors of a kernel row (2K taps from them),
    but halve the grid; at RedNet-50's last stage (7 x 7 outputs) in bfloat16, batch 32, the
    pairs' forward is 224 blocks for an H200's 132 SMs of four."""
    if policy is not None and policy.last_pixels is not None:
        return policy.last_pixels
    pair = source.constants["LAST_PAIR_PIXELS"]
    occupancy = launch_occupancy(launcher, source, kernel, dtype, (*specialisation, str(pair)), device, BLOCK_SIZE)
    held = None if occupancy is None else occupancy(0)
    if not held or not held[0]:
        return pair
    blocks_per_sm, sms = held
    blocks = min(MAX_BLOCKS, -(-pair_threads // BLOCK_SIZE))
    return 1 if blocks < source.constants["LAST_PAIRS_MIN_WAVES"] * blocks_per_sm * sms else pair


def _last_serves(source: KernelSource, kernel_size, stride, dilation, activations: tuple[Tensor, Tensor],
                 weight: Tensor, channels: int, groups: int) -> Optional[tuple[tuple[str, str], int]]:
    """(the instantiation, the lanes a group's channels take) of ``involution_last.cu``'s
    kernels for a call, or None where they decline: another layout (the two activations
    channels_last, the weight pixel-major), a window ``_last_window`` declines, a grouping
    ``last_parts`` declines, an activation not aligned to the vector."""
    specialisation = _last_window(source, kernel_size, stride, dilation)
    last = torch.channels_last
    if specialisation is None or not (all(a.is_contiguous(memory_format=last) for a in activations)
                                      and is_pixel_major(weight)):
        return None
    parts = last_parts(source, channels, groups, activations[0].dtype)
    if parts is None or any(a.data_ptr() % source.constants["VECTOR_BYTES"] for a in activations):
        return None
    return specialisation, parts


def _launch_last(kernel: str, activations: tuple[Tensor, Tensor], weight: Tensor, input_shape, groups: int,
                 kernel_size, stride, padding, dilation, out: Tensor, launcher: Optional[Launcher],
                 policy: Optional[LaunchPolicy] = None) -> Optional[Tensor]:
    """Launch ``kernel`` of ``involution_last.cu`` (its forward or grad_weight) into ``out`` over
    the output pixels of the pixel-major ``weight`` (the tensor read or written there), one or
    two adjacent pixels of a row a work item (``last_pixels``), or None, nothing launched, where
    it declines: what ``_last_serves`` declines, more work items than an int counts."""
    source = load_source(LAST_SOURCE)
    n, channels, height, width = input_shape
    served = _last_serves(source, kernel_size, stride, dilation, activations, weight, channels, groups)
    if served is None:
        return None
    specialisation, parts = served
    out_h, out_w = weight.shape[4:]
    launcher = launcher or cupy_launcher()
    pair_threads = n * out_h * -(-out_w // source.constants["LAST_PAIR_PIXELS"]) * groups * parts
    pixels = last_pixels(launcher, source, kernel, out.dtype, specialisation, out.device, pair_threads, policy)
    threads = n * out_h * -(-out_w // pixels) * groups * parts
    if threads > POLICY.index32_limit:  # the kernel counts its work items in an int
        return None
    operands = tuple(t for t in (*activations, weight) if t is not out)
    _run(launcher, kernel, out, True, operands, (threads, channels, height, width, groups, out_h, out_w, *padding),
         threads, (*specialisation, str(pixels)), LAST_SOURCE)
    return out


def involution_last(input: Tensor, weight: Tensor, stride, padding, dilation, out: Tensor,
                    launcher: Optional[Launcher] = None, policy: Optional[LaunchPolicy] = None) -> Optional[Tensor]:
    """input: (N, C, H, W) channels_last, weight: (N, G, K, K, Ho, Wo) pixel-major -> out:
    (N, C, Ho, Wo) channels_last, by the kernel whose lanes each own a 16-byte vector of a
    group's channels at one or two adjacent pixels of a row (``last_pixels``), the warp's weights
    staged in shared memory; None, out untouched, where it declines (``_launch_last``). The
    same bits as ``involution``'s chunked kernel."""
    groups, kh, kw = weight.shape[1:4]
    return _launch_last("involution_forward_last", (input, out), weight, input.shape, groups, (kh, kw), stride,
                        padding, dilation, out, launcher, policy)


def involution_last_backward_input(grad_output: Tensor, weight: Tensor, input_size, stride, padding, dilation,
                                   out: Tensor, launcher: Optional[Launcher] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo) channels_last, weight: (N, G, K, K, Ho, Wo) pixel-major ->
    out: grad_input (N, C, H, W) channels_last, by the kernel whose block takes a segment of a
    band of ``LAST_GRAD_INPUT_ROWS`` input rows (a lane a 16-byte vector of a group's channels
    in each row) and stages, for each output row the band reads, the band's kernel rows of its
    weights in shared memory; None, out untouched, where it declines: what ``_launch_last``
    declines, a pixel's vectors not a power of two up to a block (the segment is a block's lanes
    over them), and a weight that does not start and end on a ``WEIGHT_UNIT_BYTES`` boundary
    (a 16-bit weight of an odd count of values, or a view from an odd value: the staging copies
    whole 4-byte units). The same bits as ``involution_backward_input``'s chunked kernel."""
    source = load_source(LAST_SOURCE)
    last = torch.channels_last
    if not grad_output.is_contiguous(memory_format=last):  # (before a buffer for NCHW calls)
        return None
    unit = source.constants["WEIGHT_UNIT_BYTES"]
    if weight.data_ptr() % unit or weight.numel() * weight.element_size() % unit:
        return None
    # (an out whose size makes the two layouts one, a 1x1 map, may come contiguous: the kernel
    # writes a channels_last buffer, copied into it)
    result = out if out.is_contiguous(memory_format=last) else torch.empty_like(out, memory_format=last)
    n, channels = grad_output.shape[:2]
    groups, (height, width), (out_h, out_w) = weight.shape[1], input_size, weight.shape[4:]
    served = _last_serves(source, weight.shape[2:4], stride, dilation, (grad_output, result), weight, channels, groups)
    threads_per_block = source.constants["LAST_THREADS"]
    vectors = channels // POLICY.lanes(grad_output.dtype)
    if served is None or vectors > threads_per_block or vectors & (vectors - 1):
        return None
    specialisation, _ = served
    segment, rows = threads_per_block // vectors, source.constants["LAST_GRAD_INPUT_ROWS"]
    threads = n * -(-height // rows) * -(-width // segment) * threads_per_block
    if threads > POLICY.index32_limit:  # the kernel counts its segments in an int
        return None
    _run(launcher or cupy_launcher(), "involution_backward_input_last", result, True, (grad_output, weight),
         (threads, channels, height, width, groups, out_h, out_w, *padding), threads, specialisation, LAST_SOURCE)
    return out if result is out else out.copy_(result)


def involution_last_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding, dilation,
                                    groups: int, out: Tensor, launcher: Optional[Launcher] = None,
                                    policy: Optional[LaunchPolicy] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W), both channels_last -> out: grad_weight
    (N, G, K, K, Ho, Wo), pixel-major, by the kernel whose lanes lie along a group's channels (a
    16-byte vector each) at one or two adjacent pixels of a row (``last_pixels``) and sum the
    group by shuffles; None, out untouched, where it declines (``_launch_last``)."""
    return _launch_last("involution_backward_weight_last", (grad_output, input), out, input.shape, groups, kernel_size,
                        stride, padding, dilation, out, launcher, policy)


def _generated(kernel: str, activation: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor],
               kernel_size, stride, padding, dilation, out: Tensor, launcher: Optional[Launcher]) -> Tensor:
    """The fused-generation forward (``kernel`` "involution_generated_forward", ``activation`` the
    input) or grad_input ("..._backward_input", ``activation`` grad_output) into ``out``, one
    thread per (sample, group, pixel of it); the kernels are generic (no shared-memory tiles yet)."""
    n, channels = activation.shape[:2]
    out_size = tuple(out.shape[2:])
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias
    operands = tuple(t.contiguous() for t in (activation, feature, span_weight, bias))
    # The kernels' scalars name the input's size and the output's, whichever is read.
    height, width = out_size if kernel.endswith("backward_input") else activation.shape[2:]
    threads = n * groups * out_size[0] * out_size[1]
    scalars = (threads, channels, height, width, groups, *kernel_size, *feature.shape[2:], *stride, *padding, *dilation,
               feature.shape[1])
    return _run(launcher or cupy_launcher(), kernel, out, out.is_contiguous(), operands, scalars, threads,
                source=GENERATED_SOURCE)


def involution_generated(input: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor], kernel_size,
                         stride, padding, dilation, out: Tensor, launcher: Optional[Launcher] = None) -> Tensor:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo) -> out: (N, C, Ho, Wo), by the first kernel
    that serves the call of: the tensor-core one (``involution_generated_mma``: float16 and
    bfloat16 on sm_80 and newer, output rows of at least ``MMA_TILE_W`` pixels, which its runs
    fill, or narrower ones it folds, two rows a run), the tiled one
    (``involution_generated_tile``), the generic one. The order is the fifth H200 draw's
    (bench/results/h200/draw5/involution-cuda.md): both fused kernels faster than the generic one
    at every RedNet-50 row, the tensor-core one the faster of the two except at stage 4's 7x7
    output maps, where a 16-pixel run covered 7. Folded runs cover 14 of 16 there; that they
    make it the faster there too is the offline model's prediction (bench/results/cuda-model.md),
    which the next draw's kernel table (both kernels' columns) confirms or refutes."""
    source = load_source(GENERATED_MMA_SOURCE)
    fills = out.shape[3] >= source.constants["MMA_TILE_W"] or generated_mma_folds(source, out.shape[3], kernel_size,
                                                                                     stride, dilation)
    if fills and involution_generated_mma(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation,
                                          out, launcher) is not None:
        return out
    if involution_generated_tile(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation, out,
                                 launcher) is not None:
        return out
    return _generated("involution_generated_forward", input, feature, span_weight, span_bias, kernel_size, stride,
                      padding, dilation, out, launcher)


def involution_generated_backward_input(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                        span_bias: Optional[Tensor], input_size, kernel_size, stride, padding, dilation,
                                        out: Tensor, launcher: Optional[Launcher] = None) -> Tensor:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) -> out: grad_input (N, C, H, W),
    through the weight map: the span conv (``generated_weight``: cuBLAS's batched products over
    the feature's pixel rows, float32 kept float32, pixel-major when the feature is
    channels_last) writes the (N, G, KH, KW, Ho, Wo) weight in the op's dtype, which
    involution's grad_input kernels read (``involution_backward_input``: the vectors, chunked or
    generic kernel, whichever serves the call), as ``Involution2d``'s unfused path does. On the sixth H200 draw that pair took a fraction of the generic kernel's time
    (bench/results/h200/draw6/: Nsight Compute's involution_generated_backward_input at stage 2
    against the kernel table's span conv and grad_input); the generic kernel
    (``involution_generated_backward_input_generic``) and the tensor-core one
    (``involution_generated_mma_backward_input``) stay for the benches. 16-bit operands take
    the route in float32, the map and grad_input's kernel both, rounded once at the end: a
    16-bit map rounds every weight before grad_input's sums over the taps, which put 16-bit
    results up to 0.9x of the op's tolerance of the float64 reference on the registry's samples
    (by the thread count of the span conv's products), and past it in one run of the
    sanitizer's tier."""
    dtype = _accumulation_dtype(grad_output.dtype)
    if dtype == grad_output.dtype:
        weight = generated_weight(feature, span_weight, span_bias, kernel_size)
        return involution_backward_input(grad_output, weight, input_size, stride, padding, dilation, out, launcher)
    wide = tuple(None if t is None else t.to(dtype) for t in (grad_output, feature, span_weight, span_bias))
    weight = generated_weight(*wide[1:], kernel_size)
    result = involution_backward_input(wide[0], weight, input_size, stride, padding, dilation,
                                       result_like(wide[0], input_size), launcher)
    return out.copy_(result)


def involution_generated_backward_input_generic(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                                span_bias: Optional[Tensor], input_size, kernel_size, stride, padding,
                                                dilation, out: Tensor, launcher: Optional[Launcher] = None) -> Tensor:
    """involution_generated_backward_input by ``involution_generated.cu``'s generic kernel: one
    thread per (sample, group, input pixel), the weights formed in registers from the feature
    and the span rows (never a map); the op's CUDA kernel before the map route."""
    return _generated("involution_generated_backward_input", grad_output, feature, span_weight, span_bias, kernel_size,
                      stride, padding, dilation, out, launcher)


# Each op's CUDA dispatch for the self-check and the tests, (*op args, launcher, policy=None):
# the result allocated as the op allocates it, then written by the function above.


@cuda_dispatch("oplib::involution", (SOURCE, VECTORS_SOURCE, LAST_SOURCE),
               ["involution_forward", "involution_forward_chunked", "involution_forward_vectors",
                "involution_forward_last"])
def launch_involution(input, weight, stride, padding, dilation, launcher: Launcher, policy=None) -> Tensor:
    out = result_like(input, weight.shape[4:])
    return involution(input, weight, stride, padding, dilation, out, launcher, policy)


# involution's grad_input kernels, whichever serves the call: also those of the fused op's grad_input.
GRAD_INPUT_KERNELS = ("involution_backward_input", "involution_backward_input_chunked", "involution_backward_input_vectors",
                      "involution_backward_input_last")


@cuda_dispatch("oplib::involution_backward_input", (SOURCE, VECTORS_SOURCE, LAST_SOURCE), GRAD_INPUT_KERNELS)
def launch_involution_backward_input(grad_output, weight, input_size, stride, padding, dilation, launcher: Launcher,
                                     policy=None) -> Tensor:
    out = result_like(grad_output, input_size)
    return involution_backward_input(grad_output, weight, input_size, stride, padding, dilation, out, launcher, policy)


@cuda_dispatch("oplib::involution_backward_weight", (SOURCE, VECTORS_SOURCE, LAST_SOURCE, DENSE_WINDOW_SOURCE),
               ["involution_backward_weight", "involution_backward_weight_chunked", "involution_backward_weight_vectors",
                "involution_backward_weight_last", "involution_dense_window_backward_weight"])
def launch_involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups: int,
                                      launcher: Launcher, policy=None) -> Tensor:
    shape = (input.shape[0], groups, *kernel_size, *grad_output.shape[2:])
    out = weight_result(grad_output, shape, is_channels_last(input))
    return involution_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups, out, launcher,
                                      policy)


@cuda_dispatch("oplib::involution_generated", (GENERATED_SOURCE, GENERATED_MMA_SOURCE, SPAN_TILE_SOURCE),
               ["involution_generated_forward", "involution_generated_tile", "involution_generated_mma"])
def launch_involution_generated(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation,
                                launcher: Launcher) -> Tensor:
    out = result_like(input, feature.shape[2:])
    return involution_generated(input, feature, span_weight, span_bias, kernel_size, stride, padding, dilation, out,
                                launcher)


@cuda_dispatch("oplib::involution_generated_backward_input", (SOURCE, VECTORS_SOURCE, LAST_SOURCE), GRAD_INPUT_KERNELS)
def launch_involution_generated_backward_input(grad_output, feature, span_weight, span_bias, input_size, kernel_size,
                                               stride, padding, dilation, launcher: Launcher) -> Tensor:
    out = result_like(grad_output, input_size)
    return involution_generated_backward_input(grad_output, feature, span_weight, span_bias, input_size, kernel_size,
                                               stride, padding, dilation, out, launcher)


# ---------------------------------------------------------------------------------------
# The span 1x1 conv as a tiled kernel (span_tile.cu), the first stage of the tiled kernels
# ---------------------------------------------------------------------------------------




def span_tile_stride(source: KernelSource, dtype: torch.dtype) -> int:
    """Values per staged row of the span product's chunks: 16-bit values as tensor-core
    fragments take them, float and double as the FMA lanes read them."""
    return source.constants[{2: "SPAN_TILE_STRIDE", 8: "SPAN_TILE_FMA64_STRIDE"}.get(dtype.itemsize, "SPAN_TILE_FMA_STRIDE")]


def span_tile_config(source: KernelSource, dtype: torch.dtype, batch: int, rows: int, plane: int) -> LaunchConfig:
    """``involution_span_tile``'s launch: a block of ``SPAN_TILE_WARPS`` warps per tile of
    ``SPAN_TILE_PIXELS`` pixels x ``SPAN_TILE_ROWS`` rows of a sample, with the dynamic shared
    memory the source's layout takes (two staged chunks of ``_span_tile_stride`` values per
    pixel and per row, and the sums, in float or, for float64, double)."""
    c = source.constants
    pixels, tile_rows = c["SPAN_TILE_PIXELS"], c["SPAN_TILE_ROWS"]
    accumulator = 8 if dtype == torch.float64 else 4
    shared_bytes = ((pixels + tile_rows) * span_tile_stride(source, dtype) * dtype.itemsize
                    + tile_rows * c["SPAN_TILE_SUMS_STRIDE"] * accumulator)
    grid = (-(-plane // pixels), -(-rows // tile_rows), batch)
    return LaunchConfig(grid, (32, c["SPAN_TILE_WARPS"]), shared_bytes)


def span_tile(feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor],
              launcher: Optional[Launcher] = None) -> Tensor:
    """The span 1x1 conv of ``Involution2d`` through ``span_tile.cu``: feature (N, R, Ho, Wo),
    span_weight (rows, R), span_bias (rows,) or None -> the generated weights (N, rows, Ho, Wo),
    ``bias[k] + sum_r span_weight[k, r] * feature[n, r]`` (rows = G*KH*KW; N at most 65535,
    the grid's z)."""
    source = load_source(SPAN_TILE_SOURCE)
    n, reduced, out_h, out_w = feature.shape
    rows = span_weight.shape[0]
    out = feature.new_empty(n, rows, out_h, out_w)
    if out.numel() == 0:
        return out
    bias = span_weight.new_zeros(rows) if span_bias is None else span_bias
    operands = tuple(t.contiguous() for t in (feature, span_weight, bias))
    config = span_tile_config(source, feature.dtype, n, rows, out_h * out_w)
    (launcher or cupy_launcher()).launch(source, "involution_span_tile", feature.dtype, config,
                                         (*operands, out, out_h * out_w, reduced, rows))
    return out


# ---------------------------------------------------------------------------------------
# involution_generated's forward as a tiled kernel (span_tile.cu): the weights of a tile of
# pixels formed on tensor cores (float16/bfloat16) or by register-blocked FMAs into shared
# memory, and used there at once
# ---------------------------------------------------------------------------------------


def tile_input_size(source: KernelSource, kernel_size, stride, dilation) -> tuple[int, int]:
    """The input rows and columns a tile's windows read, as the kernel computes them."""
    c = source.constants
    return tuple((tile - 1) * s + (k - 1) * d + 1
                 for tile, k, s, d in zip((c["GEN_TILE_H"], c["GEN_TILE_W"]), kernel_size, stride, dilation))


def generated_tile_staging_bytes(source: KernelSource, dtype: torch.dtype, kernel_size, stride, dilation) -> int:
    """The staging region of ``involution_generated_tile``'s shared memory (the span product's
    two chunks, or the input chunk, whichever is larger), rounded up to 16 bytes: where the
    tile's weights start."""
    c = source.constants
    accumulator = 8 if dtype == torch.float64 else 4
    in_h, in_w = tile_input_size(source, kernel_size, stride, dilation)
    staging = max(2 * c["SPAN_TILE_PIXELS"] * span_tile_stride(source, dtype) * dtype.itemsize,
                  in_h * (in_w | 1) * c["GEN_TILE_IN_STRIDE"] * accumulator)
    return -(-staging // 16) * 16


def generated_tile_shared_bytes(source: KernelSource, dtype: torch.dtype, kernel_size, stride, dilation) -> int:
    """The dynamic shared memory of ``involution_generated_tile``: the staging region, then the
    tile's weights and the aggregation's partial sums."""
    c = source.constants
    accumulator = 8 if dtype == torch.float64 else 4
    partials = c["GEN_TILE_SETS"] * c["GEN_TILE_CHANNELS"] * c["GEN_TILE_PARTIAL_STRIDE"]
    return (generated_tile_staging_bytes(source, dtype, kernel_size, stride, dilation)
            + (c["GEN_TILE_TAPS"] * c["SPAN_TILE_SUMS_STRIDE"] + partials) * accumulator)


# The most dynamic shared memory a tiled launch asks for: what an sm_86/sm_89 block may have
# (99 KiB; sm_80 and sm_90 allow more), so that one choice serves every architecture.
GENERATED_TILE_MAX_SHARED = 99 * 1024


def generated_tile_config(source: KernelSource, dtype: torch.dtype, batch: int, groups: int, out_size, kernel_size,
                          stride, dilation) -> Optional[LaunchConfig]:
    """``involution_generated_tile``'s launch: a block of ``SPAN_TILE_WARPS`` warps per tile of
    ``GEN_TILE_H`` x ``GEN_TILE_W`` output pixels of a (sample, group); None where the tile does
    not serve the geometry (more taps than ``GEN_TILE_TAPS``, an input window past
    ``GENERATED_TILE_MAX_SHARED``, a grid past CUDA's y and z limits), which the generic kernel
    then computes."""
    c = source.constants
    taps = kernel_size[0] * kernel_size[1]
    shared_bytes = generated_tile_shared_bytes(source, dtype, kernel_size, stride, dilation)
    if taps > c["GEN_TILE_TAPS"] or shared_bytes > GENERATED_TILE_MAX_SHARED or groups > 65535 or batch > 65535:
        return None
    tiles = -(-out_size[0] // c["GEN_TILE_H"]) * -(-out_size[1] // c["GEN_TILE_W"])
    return LaunchConfig((tiles, groups, batch), (32, c["SPAN_TILE_WARPS"]), shared_bytes)


# The template arguments (KERNEL, STRIDE) of the involution_generated_tile instantiation that
# reads its window from its arguments (span_tile.cu: KERNEL = STRIDE = 0).
GENERATED_TILE_RUNTIME = ("0", "0")


def generated_tile_specialisation(source: KernelSource, kernel_size, stride, dilation,
                                  kernel: str = "involution_generated_tile") -> tuple[str, str]:
    """``kernel``'s template arguments after scalar_t (KERNEL, STRIDE) for a window: the
    instantiation that fixes it where the source lists one (a square kernel, equal strides, no
    dilation), else ``GENERATED_TILE_RUNTIME``. Both give the same bits."""
    fixed = (str(kernel_size[0]), str(stride[0]))
    square = kernel_size[0] == kernel_size[1] and stride[0] == stride[1] and tuple(dilation) == (1, 1)
    if square and fixed in {specialisation[:2] for specialisation in source.specialisations[kernel]}:
        return fixed
    return GENERATED_TILE_RUNTIME


def _fused_scalars(input: Tensor, feature: Tensor, out: Tensor, groups: int, kernel_size, stride, padding, dilation,
                   tile_w: int) -> tuple:
    """The scalars of involution_generated_tile and involution_generated_mma, which share their
    signature up to the last (a bool each kernel reads its own way): the sizes, the window, R,
    the tiles a row of the grid, the three tensors' strides."""
    n, channels, height, width = input.shape
    out_h, out_w = out.shape[2:]
    return (channels, height, width, groups, *kernel_size, out_h, out_w, *stride, *padding, *dilation,
            feature.shape[1], -(-out_w // tile_w), *input.stride(), *out.stride(), *feature.stride())


def involution_generated_tile(input: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor],
                              kernel_size, stride, padding, dilation, out: Tensor,
                              launcher: Optional[Launcher] = None, specialised: bool = True) -> Optional[Tensor]:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo) -> out: (N, C, Ho, Wo), written by the tiled
    kernel in out's own strides (input, feature and out of any strides); None, out untouched,
    where ``generated_tile_config`` declines the geometry. The instantiation is
    ``generated_tile_specialisation``'s pick, or with ``specialised=False`` the one that reads
    the window from its arguments (the same bits, to compare them)."""
    source = load_source(SPAN_TILE_SOURCE)
    n, out_h, out_w = input.shape[0], *out.shape[2:]
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    config = generated_tile_config(source, input.dtype, n, groups, (out_h, out_w), kernel_size, stride, dilation)
    if config is None:
        return None
    if out.numel() == 0:
        return out
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias.contiguous()
    scalars = (*_fused_scalars(input, feature, out, groups, kernel_size, stride, padding, dilation,
                               source.constants["GEN_TILE_W"]), is_channels_last(input))
    specialisation = (generated_tile_specialisation(source, kernel_size, stride, dilation) if specialised
                      else GENERATED_TILE_RUNTIME)
    (launcher or cupy_launcher()).launch(source, "involution_generated_tile", input.dtype, config,
                                         (input, feature, span_weight.contiguous(), bias, out, *scalars), specialisation)
    return out


# ---------------------------------------------------------------------------------------
# involution_generated's forward with both products on tensor cores (generated_mma.cu):
# float16 and bfloat16, the weights of a run of pixels formed on tensor cores and aggregated
# there too, one kernel row at a time, as a band matrix
# ---------------------------------------------------------------------------------------

GENERATED_MMA_DTYPES = (torch.float16, torch.bfloat16)
# The staged kernels' (forward and grad_input): float32 too, its products in 3xTF32 (three TF32
# products a float's).
GENERATED_STAGED_DTYPES = (*GENERATED_MMA_DTYPES, torch.float32)
# The GPUs with mma.sync on 16-bit values: below, the kernel's instantiations are empty.
GENERATED_MMA_MIN_CAPABILITY = (8, 0)


def generated_mma_run_width(source: KernelSource, folded: bool = False) -> int:
    """A run's columns: ``MMA_TILE_W``, or half as many folded (8 columns of two rows)."""
    return source.constants["MMA_TILE_W"] // (2 if folded else 1)


def generated_mma_band_steps(source: KernelSource, kernel_size, stride, dilation, folded: bool = False) -> int:
    """The k-steps (16 band columns each) a run's kernel row spans: the input columns its
    pixels' windows read (a row's ``MMA_TILE_W`` pixels, or folded 8), as the kernel computes
    them."""
    columns = (generated_mma_run_width(source, folded) - 1) * stride[1] + (kernel_size[1] - 1) * dilation[1] + 1
    return -(-columns // 16)


def generated_mma_folds(source: KernelSource, out_w: int, kernel_size, stride, dilation) -> bool:
    """Whether ``involution_generated_mma`` takes folded runs (8 columns of two output rows, a
    block two samples' tiles): where a folded run's band fits ``MMA_FOLDED_BAND`` columns and
    either a row's runs then leave fewer pixels outside the map (a width past a multiple of 16
    by at most 8: a 7x7 map fills 7 of a run's 16 pixels, 14 of a folded one's; its k-steps
    are at most a run's) or a run's band would not fit ``MMA_BAND``."""
    c = source.constants
    if 16 * generated_mma_band_steps(source, kernel_size, stride, dilation, True) > c["MMA_FOLDED_BAND"]:
        return False
    if 16 * generated_mma_band_steps(source, kernel_size, stride, dilation) > c["MMA_BAND"]:
        return True
    half = generated_mma_run_width(source, True)
    return -(-out_w // half) * half < -(-out_w // c["MMA_TILE_W"]) * c["MMA_TILE_W"]


def generated_mma_staged_rows(source: KernelSource, out_h: int, kernel_size, stride, dilation, folded: bool) -> int:
    """The input rows ``involution_generated_mma`` stages for a sample's tile: those its
    ``MMA_TILE_H`` output rows' windows read, or folded a shorter map's (two samples' rows
    of stride 2's 7x7 map then fit)."""
    rows = min(source.constants["MMA_TILE_H"], out_h) if folded else source.constants["MMA_TILE_H"]
    return (rows - 1) * stride[0] + (kernel_size[0] - 1) * dilation[0] + 1


def generated_mma_shared_bytes(source: KernelSource, out_h: int, kernel_size, stride, dilation, folded: bool) -> int:
    """The dynamic shared memory of ``involution_generated_mma`` for an output map of ``out_h``
    rows, in folded runs or not (``generated_mma_folds``): the span chunk or the staged input
    chunk (one place; folded, two samples'), each warp's plain weights and bands, hi and lo
    (generated_mma.cu lays them out)."""
    c = source.constants
    stride_words = 8 * generated_mma_band_steps(source, kernel_size, stride, dilation, folded) + 4
    tap_tiles = -(-kernel_size[0] * kernel_size[1] // 8)
    plain_stride = 4 * tap_tiles + (0 if tap_tiles % 2 else 4)
    in_h = generated_mma_staged_rows(source, out_h, kernel_size, stride, dilation, folded)
    staged = max(c["MMA_TAPS"] * c["MMA_SPAN_STRIDE"], (2 if folded else 1) * in_h * c["MMA_CHANNELS"] * stride_words)
    return 4 * (staged + 2 * c["MMA_WARPS"] * c["MMA_TILE_W"] * (plain_stride + stride_words))


def generated_mma_config(source: KernelSource, dtype: torch.dtype, batch: int, groups: int, out_size, kernel_size,
                         stride, dilation) -> Optional[LaunchConfig]:
    """``involution_generated_mma``'s launch: a block of ``MMA_WARPS`` warps per tile of
    ``MMA_TILE_H`` x ``MMA_TILE_W`` output pixels of a (sample, group), or folded
    (``generated_mma_folds``) per two samples' tiles of ``MMA_TILE_H`` x 8; None where it does
    not serve the call (a dtype without the tensor-core product, more taps than ``MMA_TAPS``, a
    kernel row wider than ``MMA_BAND_WIDTH`` or a run's spanning more than its band's columns,
    shared memory past ``GENERATED_TILE_MAX_SHARED``, a grid past CUDA's y and z limits)."""
    c = source.constants
    if dtype not in GENERATED_MMA_DTYPES or kernel_size[0] * kernel_size[1] > c["MMA_TAPS"]:
        return None
    folded = generated_mma_folds(source, out_size[1], kernel_size, stride, dilation)
    band = c["MMA_FOLDED_BAND"] if folded else c["MMA_BAND"]
    if kernel_size[1] > c["MMA_BAND_WIDTH"] or 16 * generated_mma_band_steps(source, kernel_size, stride, dilation,
                                                                              folded) > band:
        return None
    shared_bytes = generated_mma_shared_bytes(source, out_size[0], kernel_size, stride, dilation, folded)
    if shared_bytes > GENERATED_TILE_MAX_SHARED or groups > 65535 or batch > 65535:
        return None
    tiles = -(-out_size[0] // c["MMA_TILE_H"]) * -(-out_size[1] // generated_mma_run_width(source, folded))
    return LaunchConfig((tiles, groups, -(-batch // 2) if folded else batch), (32, c["MMA_WARPS"]), shared_bytes)


def generated_mma_vectors_fit(input: Tensor, groups: int) -> bool:
    """Whether the kernel may stage ``input`` by 16-byte vectors of 8 channels: channels_last,
    every pixel's and every group's channels starting at a multiple of 8 values, aligned."""
    lanes = POLICY.lanes(input.dtype)
    n_stride, c_stride, h_stride, w_stride = input.stride()
    return (c_stride == 1 and all(s % lanes == 0 for s in (n_stride, h_stride, w_stride))
            and POLICY.vectors_fit(input.shape[1], input.shape[1] // groups, input))


def involution_generated_mma(input: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor],
                             kernel_size, stride, padding, dilation, out: Tensor,
                             launcher: Optional[Launcher] = None, specialised: bool = True) -> Optional[Tensor]:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo) -> out: (N, C, Ho, Wo), written by the
    tensor-core kernel in out's own strides (input, feature and out of any strides); None, out
    untouched, where ``generated_mma_config`` declines the call or the GPU predates sm_80. The
    instantiation is ``generated_tile_specialisation``'s pick, or with ``specialised=False`` the
    one that reads the window from its arguments (the same bits, to compare them), in folded runs
    where ``generated_mma_folds`` says (its last template argument)."""
    source = load_source(GENERATED_MMA_SOURCE)
    n, out_h, out_w = input.shape[0], *out.shape[2:]
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    config = generated_mma_config(source, input.dtype, n, groups, (out_h, out_w), kernel_size, stride, dilation)
    if config is None or (input.is_cuda and torch.cuda.get_device_capability(input.device) < GENERATED_MMA_MIN_CAPABILITY):
        return None
    if out.numel() == 0:
        return out
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias.contiguous()
    folded = generated_mma_folds(source, out_w, kernel_size, stride, dilation)
    scalars = (*_fused_scalars(input, feature, out, groups, kernel_size, stride, padding, dilation,
                               generated_mma_run_width(source, folded)), generated_mma_vectors_fit(input, groups),
               generated_mma_feature_words(feature), n)
    window = (generated_tile_specialisation(source, kernel_size, stride, dilation, "involution_generated_mma")
              if specialised else GENERATED_TILE_RUNTIME)
    specialisation = (*window, "true" if folded else "false")
    (launcher or cupy_launcher()).launch(source, "involution_generated_mma", input.dtype, config,
                                         (input, feature, span_weight.contiguous(), bias, out, *scalars), specialisation)
    return out


# ---------------------------------------------------------------------------------------
# involution_generated's grad_input on tensor cores (generated_mma.cu's
# involution_generated_mma_backward_input): the forward's band, transposed
# ---------------------------------------------------------------------------------------


def generated_mma_backward_extent(source: KernelSource, kernel_size, stride, dilation) -> tuple[int, int]:
    """(rows, k-steps) of grad_output a tile of ``MMA_TILE_H`` x ``MMA_TILE_W`` input pixels reads
    at most, as the kernel computes them: the output rows, and the band's output columns in
    k-steps of 16."""
    c = source.constants
    rows, columns = (-(-(tile - 1 + (k - 1) * d) // s) + 1
                     for tile, k, s, d in zip((c["MMA_TILE_H"], c["MMA_TILE_W"]), kernel_size, stride, dilation))
    return rows, -(-columns // 16)


def generated_mma_backward_shared_bytes(source: KernelSource, kernel_size, stride, dilation, reduced: int) -> int:
    """The dynamic shared memory of ``involution_generated_mma_backward_input``: the group's span
    rows, the staged grad_output chunk, each warp's two bands, an output row's feature at the
    band's pixels (generated_mma.cu lays them out)."""
    c = source.constants
    rows, k_steps = generated_mma_backward_extent(source, kernel_size, stride, dilation)
    stride_words, span_stride = 8 * k_steps + 4, 8 * -(-reduced // 16) + 4
    span_rows = (kernel_size[0] - 1) * kernel_size[1] + 8
    return 4 * (span_rows * span_stride + rows * c["MMA_CHANNELS"] * stride_words
                + 2 * c["MMA_WARPS"] * c["MMA_TILE_W"] * stride_words + 16 * k_steps * span_stride)


def generated_mma_backward_config(source: KernelSource, dtype: torch.dtype, batch: int, groups: int, input_size,
                                  kernel_size, stride, dilation, reduced: int) -> Optional[LaunchConfig]:
    """``involution_generated_mma_backward_input``'s launch: a block of ``MMA_WARPS`` warps per
    tile of ``MMA_TILE_H`` x ``MMA_TILE_W`` pixels of grad_input of a (sample, group); None where
    it does not serve the call (a dtype without the tensor-core product, a kernel row wider than
    one n-tile of taps, ``MMA_BAND_WIDTH``, or reading more than ``MMA_GRAD_BAND`` output columns,
    shared memory past ``GENERATED_TILE_MAX_SHARED`` (a large R: the group's span_weight is
    staged whole), a grid past CUDA's y and z limits)."""
    c = source.constants
    if dtype not in GENERATED_MMA_DTYPES or kernel_size[1] > c["MMA_BAND_WIDTH"]:
        return None
    if 16 * generated_mma_backward_extent(source, kernel_size, stride, dilation)[1] > c["MMA_GRAD_BAND"]:
        return None
    shared_bytes = generated_mma_backward_shared_bytes(source, kernel_size, stride, dilation, reduced)
    if shared_bytes > GENERATED_TILE_MAX_SHARED or groups > 65535 or batch > 65535:
        return None
    tiles = -(-input_size[0] // c["MMA_TILE_H"]) * -(-input_size[1] // c["MMA_TILE_W"])
    return LaunchConfig((tiles, groups, batch), (32, c["MMA_WARPS"]), shared_bytes)


def generated_mma_pair_stores(out: Tensor, groups: int) -> bool:
    """generated_mma.cu's mma_pair_stores: whether a pair of a group's channels (c, c + 1; c
    even) is one aligned store in ``out`` (a 32-bit word, float32's 8 bytes): channels_last, even
    strides and group size."""
    n_stride, c_stride, h_stride, w_stride = out.stride()
    return (c_stride == 1 and all(s % 2 == 0 for s in (n_stride, h_stride, w_stride, out.shape[1] // groups))
            and out.data_ptr() % (2 * out.element_size()) == 0)


def _staged_vectors(x: Tensor, feature: Tensor, out: Tensor, groups: int) -> tuple[bool, bool, str]:
    """The staged kernels' runtime flags (``x``'s 8-channel units vectors, the feature's pairs
    words) and their VECTORS template argument: "true", the instantiation with only the vector
    ways, where those two and ``out``'s pair stores all hold (channels_last, aligned)."""
    vector_x, feature_words = generated_mma_vectors_fit(x, groups), generated_mma_feature_words(feature)
    vectors = vector_x and feature_words and generated_mma_pair_stores(out, groups)
    return vector_x, feature_words, "true" if vectors else "false"


def generated_mma_feature_words(feature: Tensor) -> bool:
    """Whether the kernel may load the feature's pairs of reduced channels (r, r + 1; r even) as
    one aligned load (a 32-bit word, float32's 8 bytes): channels_last with an even R, every
    pixel's channels starting at an even element of a tensor aligned to a pair."""
    n_stride, c_stride, h_stride, w_stride = feature.stride()
    return (c_stride == 1 and feature.shape[1] % 2 == 0 and all(s % 2 == 0 for s in (n_stride, h_stride, w_stride))
            and feature.data_ptr() % (2 * feature.element_size()) == 0)


def generated_mma_feature_pairs(feature: Tensor) -> bool:
    """Whether the staged forward may load a reduced channel's values at a pixel pair (x, x + 1;
    x even) as one aligned 32-bit word (``staged_feature_pixel_pairs``): 16-bit NCHW rows (unit
    width stride) of an even width, every row starting at an even element of a 4-byte aligned
    tensor. (A channels_last feature takes its channel pairs as words instead.)"""
    n_stride, c_stride, h_stride, w_stride = feature.stride()
    return (feature.element_size() == 2 and w_stride == 1 and feature.shape[3] % 2 == 0
            and all(s % 2 == 0 for s in (n_stride, c_stride, h_stride)) and feature.data_ptr() % 4 == 0)


def involution_generated_mma_backward_input(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                            span_bias: Optional[Tensor], input_size, kernel_size, stride, padding,
                                            dilation, out: Tensor, launcher: Optional[Launcher] = None,
                                            specialised: bool = True) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) -> out: grad_input (N, C, H, W),
    written by the tensor-core kernel in out's own strides (every operand of any strides); None,
    out untouched, where ``generated_mma_backward_config`` declines the call or the GPU predates
    sm_80. ``specialised`` as ``involution_generated_mma``'s."""
    source = load_source(GENERATED_MMA_SOURCE)
    n, channels = grad_output.shape[:2]
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    reduced = feature.shape[1]
    config = generated_mma_backward_config(source, grad_output.dtype, n, groups, input_size, kernel_size, stride,
                                           dilation, reduced)
    if config is None or (grad_output.is_cuda
                          and torch.cuda.get_device_capability(grad_output.device) < GENERATED_MMA_MIN_CAPABILITY):
        return None
    if out.numel() == 0:
        return out
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias.contiguous()
    tiles_w = -(-input_size[1] // source.constants["MMA_TILE_W"])
    scalars = (channels, *input_size, groups, *kernel_size, *grad_output.shape[2:], *stride, *padding, *dilation,
               reduced, tiles_w, *grad_output.stride(), *out.stride(), *feature.stride(),
               generated_mma_vectors_fit(grad_output, groups), generated_mma_feature_words(feature))
    kernel = "involution_generated_mma_backward_input"
    specialisation = (generated_tile_specialisation(source, kernel_size, stride, dilation, kernel) if specialised
                      else GENERATED_TILE_RUNTIME)
    (launcher or cupy_launcher()).launch(source, kernel, grad_output.dtype, config,
                                         (grad_output, feature, span_weight.contiguous(), bias, out, *scalars),
                                         specialisation)
    return out


# ---------------------------------------------------------------------------------------
# involution_generated's grad_input with the weights staged (generated_mma.cu's
# involution_generated_mma_backward_input_staged): formed on tensor cores into shared memory,
# summed by FMAs
# ---------------------------------------------------------------------------------------

# A warp's runs along a row, the host's choice (8 / runs_w rows of runs).
GENERATED_STAGED_RUNS_W = (8, 4, 2)
# The least share of a launch's tile pixels that lie in the map for the kernel to take the call
# (a 7x7 map in the smallest tiles fills 49 of 256): below it, the map route serves.
GENERATED_STAGED_MIN_FILL = 0.5
# The blocks of 8 warps an SM must hold at once for the staged forward's schedulers to issue
# every cycle: the offline model's dependent_issue_cycles (8.5, fitted on the H200's table,
# bench/results/cuda-model.json) over the 2 warps a block gives each of an SM's 4 schedulers.
# Fewer, and its instructions issue that much slower (device_model.launch_terms' issue term).
STAGED_ISSUE_BLOCKS = 4.25
# What a tile pixel's weights cost the staged forward to form, over a summed pixel of a warp, at
# R = 128 (the forming scales with R; the sums do not): every pixel of a tile is formed, inside
# the map or not, so tiles that cover a small map with more pixels past it form more. From the
# SASS of the 16-bit instantiation, about 0.18 (per 16 pixels an m-tile, R / 16 k-steps of
# T / 8 products and their loads, against T taps' sums of 16 channels a warp pixel); the
# offline model's per-architecture table (bench/results/cuda-model.md) agrees with the choices
# from 0.05 to 0.2, and without it took the A100's 4-run tiles at RedNet-50's last stage in
# float32, 1.12-1.21x the 2-run ones.
STAGED_FORMED_PIXEL = 0.15
# Tile choices whose estimates (``_staged_estimate``) lie within this share of the least are
# equal to it: the estimate is coarser than that.
STAGED_ESTIMATE_TIE = 0.01


def generated_mma_staged_tile(source: KernelSource, stride: int, runs_w: int) -> tuple[int, int]:
    """(tile_h, tile_w) of grad_input pixels a block takes, as the kernel computes them: its
    warps' runs of ``STAGED_RUN`` pixels, ``stride`` columns apart, runs_w along a row, one warp
    for each row and column parity of each group of rows."""
    c = source.constants
    run, warps = c["STAGED_RUN"], c["MMA_WARPS"]
    return stride * (warps // (stride * stride)) * (warps // runs_w), stride * run * runs_w


def _best_runs(tile_of, size, warp_of=None, estimate=None) -> tuple[int, float]:
    """(runs_w, fill): of ``GENERATED_STAGED_RUNS_W``, the runs along a row whose tiles
    (``tile_of(runs_w)``) leave the fewest of their pixels outside a map of ``size`` (the wider
    on a tie), and the share of those tiles' pixels inside. With ``warp_of(runs_w)``, the pixels a
    warp takes (rows, columns; a tile holds whole warps), those of the tiles that reach
    ``GENERATED_STAGED_MIN_FILL`` whose warps holding a pixel of the map hold the fewest outside
    it (``_warp_pixels``), then as above: where a kernel's runs past the map skip their sums (the
    staged forward's), a warp the map reaches in part still issues every instruction of its
    sums for all its lanes, one it does not reach none. With ``estimate(runs_w, warp_pixels,
    covered)`` too (the GPU's: ``_staged_estimate``; ``covered`` the pixels of the tiles that
    cover the map), first the tiles whose estimate is the least (within
    ``STAGED_ESTIMATE_TIE``) of those it can tell (None: a launch past the shared memory the
    kernel may take, or a GPU that cannot tell), of any fill. ``fill`` is the best share of the
    tiles of the choices considered: whether the kernel serves the call
    (``GENERATED_STAGED_MIN_FILL``), whichever tiles it then takes."""
    candidates = []
    for runs_w in GENERATED_STAGED_RUNS_W:
        tile = tile_of(runs_w)
        covered = math.prod(-(-extent // t) * t for extent, t in zip(size, tile))
        warps = _warp_pixels(size, tile, warp_of(runs_w)) if warp_of is not None else covered
        serves = warp_of is None or math.prod(size) >= GENERATED_STAGED_MIN_FILL * covered
        cost = estimate(runs_w, warps, covered) if estimate is not None else None
        candidates.append((runs_w, math.prod(size) / covered, serves, warps, covered, cost))
    # (with the GPU's estimate, the choices it can tell, those whose launch fits; else every one)
    considered = [c for c in candidates if c[5] is not None] or candidates
    least = min((c[5] for c in considered if c[5] is not None), default=None)
    best, best_key = None, None
    for runs_w, fill, serves, warps, covered, cost in considered:
        # (pixel counts, not ratios: equal shares compare equal, and a tie keeps the wider)
        if least is not None:  # the GPU's estimate decides, whatever the tiles' fill
            key = (cost <= least * (1 + STAGED_ESTIMATE_TIE), -warps, -covered)
        else:
            key = (serves, -warps, -covered)
        if best_key is None or key > best_key:
            best, best_key = runs_w, key
    # (whether the kernel serves the call: the best fill of the choices considered)
    return best, max(c[1] for c in considered)


def _staged_estimate(config_of, occupancy, formed_weight: float = 0.0):
    """The staged forward's time on the GPU ``occupancy`` describes, up to a factor the tile
    choices share: ``(runs_w, warp_pixels, covered) -> the busiest SM's share of the warps'
    pixels and of the tile pixels whose weights they form (formed_weight each), over the issue
    rate its resident blocks allow`` (the offline model's issue term, the work of a tile's warps
    reaching the map and of its weights, formed at every pixel of the tile), or None where the
    launch would not be taken (its shared memory past ``GENERATED_TILE_MAX_SHARED``) or not fit.
    ``config_of(runs_w)``: the launch (its blocks and dynamic shared memory);
    ``occupancy(shared_bytes)``: (blocks of its threads an SM holds with that much dynamic
    shared memory, the GPU's SMs), or None. The busiest SM runs ceil(blocks / SMs) blocks, at
    most its resident count at once: a small grid leaves it fewer than it could hold."""
    def estimate(runs_w: int, warp_pixels: int, covered: int):
        config = config_of(runs_w)
        if config.shared_bytes > GENERATED_TILE_MAX_SHARED:
            return None
        held = occupancy(config.shared_bytes)
        if held is None or held[0] <= 0:
            return None
        resident, sms = held
        blocks = math.prod(config.grid)
        per_sm = -(-blocks // sms)
        work = warp_pixels + formed_weight * covered
        return per_sm / blocks * work * max(1.0, STAGED_ISSUE_BLOCKS / min(resident, per_sm))

    return estimate


def _warp_pixels(size, tile, warp) -> int:
    """The pixels of the warps that hold a pixel of a map of ``size`` covered by tiles of
    ``tile`` pixels (rows, columns), each tile whole warps of ``warp`` pixels: per axis, a whole
    tile's warps and those the last tile's part reaches."""
    reached = 1
    for extent, t, w in zip(size, tile, warp):
        whole, rest = divmod(extent, t)
        reached *= whole * (t // w) + -(-rest // w)
    return reached * math.prod(warp)


def _staged_launch(source: KernelSource, kernel_name: str, tile_of, shared_bytes_of, dtype: torch.dtype, batch: int,
                   channels: int, groups: int, size, kernel_size, stride, dilation, runs_w: Optional[int],
                   fold_of=lambda runs_w: 1, dtypes: tuple[torch.dtype, ...] = GENERATED_MMA_DTYPES,
                   chunk: Optional[int] = None, warp_of=None, occupancy=None,
                   formed_weight: float = 0.0) -> Optional[tuple[LaunchConfig, int]]:
    """The launch of either staged kernel (a block a tile of a map of ``size``, a group and a
    chunk of ``MMA_CHANNELS`` of its channels) and its runs_w: the tiles (``tile_of(runs_w)``)
    that fill the map best, or ``runs_w`` where given (one of ``GENERATED_STAGED_RUNS_W``: the
    tests take each; another is a ValueError). None where the kernel does not serve the call: a
    dtype without the tensor-core product, a window other than a square 3, 5 or 7 at equal
    strides 1 or 2 without dilation (the instantiations it has), the best tiles less than
    ``GENERATED_STAGED_MIN_FILL`` inside the map, shared memory (``shared_bytes_of(runs_w)``)
    past ``GENERATED_TILE_MAX_SHARED`` (a large R: the group's span_weight is staged whole), a
    grid past CUDA's y and z limits. ``fold_of(runs_w)``: the samples a block takes (the
    forward's small maps), ``tile_of`` then a sample's share of the tile. ``dtypes``: those the
    kernel has the tensor-core product for; ``chunk``: the channels a block takes (``MMA_CHANNELS``
    unless given); ``warp_of(runs_w)``: a warp's pixels, where the tiles are chosen by the warps
    the map reaches (``_best_runs``), and with ``occupancy`` (the GPU's, ``launch_occupancy``)
    by their estimated time there first (``_staged_estimate``, a formed tile pixel weighing
    ``formed_weight`` of a summed one)."""
    if dtype not in dtypes or tuple(dilation) != (1, 1):
        return None
    specialisation = (str(kernel_size[0]), str(stride[0]))
    windows = {served[:2] for served in source.specialisations[kernel_name]}  # (and VECTORS)
    if (kernel_size[1] != kernel_size[0] or stride[1] != stride[0]
            or specialisation not in windows or specialisation == GENERATED_TILE_RUNTIME):
        return None
    if runs_w is not None and runs_w not in GENERATED_STAGED_RUNS_W:
        raise ValueError(f"runs_w must be one of {GENERATED_STAGED_RUNS_W} (the kernel's warps in whole rows of "
                         f"runs), got {runs_w}")
    fill, chunks = 1.0, -(-(channels // groups) // (chunk or source.constants["MMA_CHANNELS"]))

    def config_of(runs_w: int) -> LaunchConfig:
        tiles = math.prod(-(-extent // t) for extent, t in zip(size, tile_of(runs_w)))
        return LaunchConfig((tiles, groups, -(-batch // fold_of(runs_w)) * chunks),
                            (32, source.constants["MMA_WARPS"]), shared_bytes_of(runs_w))

    if runs_w is None:
        estimate = (None if occupancy is None or warp_of is None
                    else _staged_estimate(config_of, occupancy, formed_weight))
        runs_w, fill = _best_runs(tile_of, size, warp_of, estimate)
    config = config_of(runs_w)
    if (fill < GENERATED_STAGED_MIN_FILL or config.shared_bytes > GENERATED_TILE_MAX_SHARED or groups > 65535
            or config.grid[2] > 65535):
        return None
    return config, runs_w


def generated_mma_staged_shared_bytes(source: KernelSource, kernel: int, stride: int, runs_w: int,
                                      reduced: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """The dynamic shared memory of ``involution_generated_mma_backward_input_staged``: the group's
    span rows (an n-tile's 8 from any tap) and their bias, grad_output over the region the tile
    reads, and the weights (generated_mma.cu lays them out). 16-bit: every kernel row's weights in
    one buffer and a tap past them, grad_output staged in the span rows' place once the weights
    are formed; float32: span rows and grad_output in floats (``STAGED_WIDE_PIXEL`` a pixel)
    apart, two buffers of ``STAGED_GRAD_ROWS`` kernel rows' weights and a tap past them."""
    c = source.constants
    tile_h, tile_w = generated_mma_staged_tile(source, stride, runs_w)
    region_h, region_w = ((t - 1 + kernel - 1 + stride - 1) // stride + 1 for t in (tile_h, tile_w))
    span_rows = kernel * kernel + 7
    tap_stride = ((tile_h // stride) * (tile_w // stride) + 27) // 32 * 32 + 4
    if dtype != torch.float32:
        span = span_rows * (8 * -(-reduced // 16) + 4 + 1)
        front = -(-max(span, region_h * region_w * c["STAGED_PIXEL"]) // 4) * 4
        return 4 * (front + (kernel * kernel + 1) * tap_stride)
    span = span_rows * generated_mma_staged_wide_span_stride(reduced) + -(-span_rows // 4) * 4
    staged = -(-region_h * region_w * c["STAGED_WIDE_PIXEL"] // 4) * 4
    buffer_taps = min(kernel, c["STAGED_GRAD_ROWS"]) * kernel
    return 4 * (span + staged + (2 * buffer_taps + 1) * tap_stride)


def generated_mma_staged_config(source: KernelSource, dtype: torch.dtype, batch: int, channels: int, groups: int,
                                input_size, kernel_size, stride, dilation, reduced: int,
                                runs_w: Optional[int] = None) -> Optional[tuple[LaunchConfig, int]]:
    """``involution_generated_mma_backward_input_staged``'s launch and runs_w (``_staged_launch``:
    tiles of grad_input, which fill the input best)."""
    return _staged_launch(source, "involution_generated_mma_backward_input_staged",
                          lambda r: generated_mma_staged_tile(source, stride[0], r),
                          lambda r: generated_mma_staged_shared_bytes(source, kernel_size[0], stride[0], r, reduced,
                                                                      dtype),
                          dtype, batch, channels, groups, input_size, kernel_size, stride, dilation, runs_w,
                          dtypes=GENERATED_STAGED_DTYPES)


def involution_generated_mma_backward_input_staged(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                                   span_bias: Optional[Tensor], input_size, kernel_size, stride,
                                                   padding, dilation, out: Tensor,
                                                   launcher: Optional[Launcher] = None,
                                                   runs_w: Optional[int] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) -> out: grad_input (N, C, H, W),
    written by the staged kernel in out's own strides (every operand of any strides); None, out
    untouched, where ``generated_mma_staged_config`` declines the call (``runs_w`` as there) or
    the GPU predates sm_80."""
    source = load_source(GENERATED_MMA_SOURCE)
    n, channels = grad_output.shape[:2]
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    reduced = feature.shape[1]
    chosen = generated_mma_staged_config(source, grad_output.dtype, n, channels, groups, input_size, kernel_size,
                                         stride, dilation, reduced, runs_w)
    if chosen is None or (grad_output.is_cuda
                          and torch.cuda.get_device_capability(grad_output.device) < GENERATED_MMA_MIN_CAPABILITY):
        return None
    if out.numel() == 0:
        return out
    config, runs_w = chosen
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias.contiguous()
    tiles_w = -(-input_size[1] // generated_mma_staged_tile(source, stride[0], runs_w)[1])
    vector_grad, feature_words, vectors = _staged_vectors(grad_output, feature, out, groups)
    scalars = (channels, *input_size, groups, *grad_output.shape[2:], *padding, reduced, tiles_w, runs_w,
               *grad_output.stride(), *out.stride(), *feature.stride(), vector_grad, feature_words)
    (launcher or cupy_launcher()).launch(source, "involution_generated_mma_backward_input_staged", grad_output.dtype,
                                         config, (grad_output, feature, span_weight.contiguous(), bias, out, *scalars),
                                         (str(kernel_size[0]), str(stride[0]), vectors))
    return out


# ---------------------------------------------------------------------------------------
# involution_generated's forward with the weights staged (generated_mma.cu's
# involution_generated_mma_staged): a tile's weights formed on tensor cores into shared memory,
# all taps at once, summed by FMAs
# ---------------------------------------------------------------------------------------


def generated_mma_staged_forward_tile(source: KernelSource, runs_w: int) -> tuple[int, int]:
    """(tile_h, tile_w) of output pixels a block takes, as the kernel computes them: its warps'
    runs of ``STAGED_RUN`` consecutive pixels, runs_w along a row (a warp's 8 runs in 8 / runs_w
    rows), the warps one above the other."""
    c = source.constants
    return c["MMA_WARPS"] * (8 // runs_w), c["STAGED_RUN"] * runs_w


def generated_mma_staged_forward_passes(kernel: int, stride: int, wide: bool = False) -> list[tuple[int, int]]:
    """The kernel rows of each pass of ``involution_generated_mma_staged``, [first, end), shared
    out evenly, the longer passes first, as the kernel takes them (generated_mma.cu's
    staged_pass_first): one pass, one more for a window of more than 32 taps (7 x 7), and one
    more at stride 2 or, ``wide`` (float32's), for such a window at stride 1 too."""
    large = kernel * kernel > 32
    passes = 1 + (stride == 2 or (wide and large)) + large
    firsts = [-(-pass_ * kernel // passes) for pass_ in range(passes + 1)]
    return list(zip(firsts[:-1], firsts[1:]))


def generated_mma_staged_forward_pass_rows(kernel: int, stride: int, wide: bool = False) -> int:
    """The most rows of the weights buffer a pass fills (its taps, from the first of the n-tile
    of 8 taps its first row's first tap lies in), as the kernel lays them out."""
    return max(end * kernel - 8 * (first * kernel // 8)
               for first, end in generated_mma_staged_forward_passes(kernel, stride, wide))


def generated_mma_staged_forward_pass_tiles(kernel: int, stride: int, wide: bool = False) -> int:
    """The most n-tiles of 8 taps a pass forms (from the n-tile its first row's first tap lies
    in): the rows of span_weight the kernel stages a pass, in eights (staged_pass_tiles)."""
    return max(-(-end * kernel // 8) - first * kernel // 8
               for first, end in generated_mma_staged_forward_passes(kernel, stride, wide))


def generated_mma_staged_forward_span_tiles(kernel: int, stride: int) -> int:
    """The n-tiles of 8 span rows the kernel holds: at stride 2 a pass's (staged again each pass),
    at stride 1 all the taps' (generated_mma.cu's SPAN_TILES)."""
    return generated_mma_staged_forward_pass_tiles(kernel, stride) if stride == 2 else -(-kernel * kernel // 8)


# The samples a block of the staged forward takes where a map fits a quarter of its tallest
# tiles (8 x 32: 8 x 8, RedNet-50's 7x7 maps), each sample's map in 8 of the tile's rows.
GENERATED_STAGED_FOLD = 4


def generated_mma_staged_forward_warp(source: KernelSource, runs_w: int) -> tuple[int, int]:
    """(rows, columns) of output pixels a warp of ``involution_generated_mma_staged`` takes: its
    8 runs of ``STAGED_RUN`` pixels, runs_w along a row."""
    return 8 // runs_w, source.constants["STAGED_RUN"] * runs_w


def generated_mma_staged_forward_fold(source: KernelSource, runs_w: int, out_size) -> int:
    """The samples a block of ``involution_generated_mma_staged`` takes in tiles of ``runs_w``:
    ``GENERATED_STAGED_FOLD`` where a map of ``out_size`` fits that share of the tile's rows,
    else 1."""
    tile_h, tile_w = generated_mma_staged_forward_tile(source, runs_w)
    fold = GENERATED_STAGED_FOLD
    return fold if out_size[0] <= tile_h // fold and out_size[1] <= tile_w else 1


def generated_mma_staged_forward_share(source: KernelSource, runs_w: int, out_size) -> tuple[int, int]:
    """(rows, columns) of a block's tile a sample takes: the tile, or folded its share."""
    tile_h, tile_w = generated_mma_staged_forward_tile(source, runs_w)
    return tile_h // generated_mma_staged_forward_fold(source, runs_w, out_size), tile_w


def generated_mma_staged_forward_region(source: KernelSource, kernel: int, stride: int, runs_w: int,
                                        out_size) -> tuple[int, int]:
    """(rows, columns) of the input a block of ``involution_generated_mma_staged`` stages for a
    sample, as the kernel computes them: the windows of the sample's share of the tile, or of a
    map of ``out_size`` smaller than it, of its own."""
    share = generated_mma_staged_forward_share(source, runs_w, out_size)
    return tuple(stride * (min(t, extent) - 1) + kernel for t, extent in zip(share, out_size))


def generated_mma_staged_wide_span_stride(reduced: int) -> int:
    """Floats a span row of the float32 staged forward (generated_mma.cu's
    staged_wide_span_stride): R in whole k-steps of 8, and 8 more where that is a multiple of 16."""
    steps = 8 * -(-reduced // 8)
    return steps + 8 if steps % 16 == 0 else steps


def generated_mma_staged_forward_shared_bytes(source: KernelSource, kernel: int, stride: int, runs_w: int,
                                              reduced: int, out_size, dtype: torch.dtype = torch.bfloat16) -> int:
    """The dynamic shared memory of ``involution_generated_mma_staged``: the span rows it holds
    (``generated_mma_staged_forward_span_tiles``; float32 a pass's at both strides, in floats),
    the bias of all the taps, the input over the region each sample's windows read
    (``generated_mma_staged_forward_region``; at stride 2 a row's even columns, then its odd
    ones; float32's in floats, ``STAGED_WIDE_PIXEL`` a pixel, or at stride 2 of a chunk of
    ``STAGED_WIDE_HALF`` channels ``STAGED_WIDE_HALF_PIXEL``), the tile's weights of a pass's
    taps (generated_mma.cu lays them out)."""
    c = source.constants
    tile_h, tile_w = generated_mma_staged_forward_tile(source, runs_w)
    region_h, region_w = generated_mma_staged_forward_region(source, kernel, stride, runs_w, out_size)
    pitch = 2 * -(-region_w // 2) if stride == 2 else region_w
    span_rows = 8 * -(-kernel * kernel // 8)
    fold = generated_mma_staged_forward_fold(source, runs_w, out_size)
    wide = dtype == torch.float32
    if wide:
        span_tiles = generated_mma_staged_forward_pass_tiles(kernel, stride, wide)
        span = 8 * span_tiles * generated_mma_staged_wide_span_stride(reduced) + span_rows
        pixel_words = c["STAGED_WIDE_HALF_PIXEL"] if stride == 2 else c["STAGED_WIDE_PIXEL"]
    else:
        span = 8 * generated_mma_staged_forward_span_tiles(kernel, stride) * (8 * -(-reduced // 16) + 4) + span_rows
        pixel_words = c["STAGED_PIXEL"]
    staged = -(-fold * region_h * pitch * pixel_words // 4) * 4
    return 4 * (span + staged + generated_mma_staged_forward_pass_rows(kernel, stride, wide) * (tile_h * tile_w + 4))


def generated_mma_staged_forward_chunk(source: KernelSource, dtype: torch.dtype, stride: int) -> int:
    """The channels a block of ``involution_generated_mma_staged`` takes: ``MMA_CHANNELS``, or
    float32's at stride 2 ``STAGED_WIDE_HALF`` (its region in floats, four times a stride-1
    one's, fits 99 KiB in 8 channels at RedNet-50's stride-2 shapes, not in 16)."""
    wide_half = dtype == torch.float32 and stride == 2
    return source.constants["STAGED_WIDE_HALF" if wide_half else "MMA_CHANNELS"]


def generated_mma_staged_forward_config(source: KernelSource, dtype: torch.dtype, batch: int, channels: int,
                                        groups: int, out_size, kernel_size, stride, dilation, reduced: int,
                                        runs_w: Optional[int] = None,
                                        occupancy=None) -> Optional[tuple[LaunchConfig, int]]:
    """``involution_generated_mma_staged``'s launch and runs_w (``_staged_launch``: tiles of the
    output whose warps the map reaches fill it best; a map that fits a share of the tallest tiles
    folded, a block ``GENERATED_STAGED_FOLD`` samples). RedNet-50's 56 x 56 maps take tiles of
    32 x 8, whose warps (4 x 8) lie inside the map or past it, where the 8 x 32 tiles' last
    column of warps (1 x 32) holds 24 pixels of the map: the offline model puts the first at
    0.89-0.90x of the second's time on each of the five GPUs it has (bench/results/cuda-model.md).
    With ``occupancy`` (the GPU's, ``launch_occupancy``) the tiles of the least estimated time
    there come first (``_staged_estimate``): where a GPU's shared memory holds fewer blocks of
    one choice's tiles than another's, as at RedNet-50's 14 x 14 maps on an L40S (100 KB an SM:
    one block of the 4-run tiles, two of the 2-run), or a grid's blocks leave its SMs idle."""
    return _staged_launch(source, "involution_generated_mma_staged",
                          lambda r: generated_mma_staged_forward_share(source, r, out_size),
                          lambda r: generated_mma_staged_forward_shared_bytes(source, kernel_size[0], stride[0], r,
                                                                              reduced, out_size, dtype),
                          dtype, batch, channels, groups, out_size, kernel_size, stride, dilation, runs_w,
                          lambda r: generated_mma_staged_forward_fold(source, r, out_size),
                          GENERATED_STAGED_DTYPES, generated_mma_staged_forward_chunk(source, dtype, stride[0]),
                          lambda r: generated_mma_staged_forward_warp(source, r), occupancy,
                          STAGED_FORMED_PIXEL * reduced / 128)


def involution_generated_mma_staged(input: Tensor, feature: Tensor, span_weight: Tensor, span_bias: Optional[Tensor],
                                    kernel_size, stride, padding, dilation, out: Tensor,
                                    launcher: Optional[Launcher] = None,
                                    runs_w: Optional[int] = None) -> Optional[Tensor]:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo) -> out: (N, C, Ho, Wo), written by the staged
    kernel in out's own strides (every operand of any strides); None, out untouched, where
    ``generated_mma_staged_forward_config`` declines the call (``runs_w`` as there) or the GPU
    predates sm_80."""
    source = load_source(GENERATED_MMA_SOURCE)
    n, channels = input.shape[:2]
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    reduced, out_size = feature.shape[1], tuple(out.shape[2:])
    if input.is_cuda and torch.cuda.get_device_capability(input.device) < GENERATED_MMA_MIN_CAPABILITY:
        return None
    vector_input, feature_words, vectors = _staged_vectors(input, feature, out, groups)
    # (an NCHW feature's pixel pairs as words: the instantiation with that k-step)
    pairs = "true" if vectors == "false" and not feature_words and generated_mma_feature_pairs(feature) else "false"
    specialisation = (str(kernel_size[0]), str(stride[0]), vectors, pairs)
    launcher = launcher or (cupy_launcher() if input.is_cuda else None)
    occupancy = None if launcher is None else launch_occupancy(
        launcher, source, "involution_generated_mma_staged", input.dtype, specialisation, input.device,
        32 * source.constants["MMA_WARPS"])
    chosen = generated_mma_staged_forward_config(source, input.dtype, n, channels, groups, out_size, kernel_size,
                                                 stride, dilation, reduced, runs_w, occupancy)
    if chosen is None:
        return None
    if out.numel() == 0:
        return out
    config, runs_w = chosen
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias.contiguous()
    tiles_w = -(-out_size[1] // generated_mma_staged_forward_tile(source, runs_w)[1])
    fold_shift = generated_mma_staged_forward_fold(source, runs_w, out_size).bit_length() - 1
    scalars = (channels, *input.shape[2:], groups, *out_size, *padding, reduced, tiles_w, runs_w, n, fold_shift,
               *input.stride(), *out.stride(), *feature.stride(), vector_input, feature_words)
    (launcher or cupy_launcher()).launch(source, "involution_generated_mma_staged", input.dtype, config,
                                         (input, feature, span_weight.contiguous(), bias, out, *scalars),
                                         specialisation)
    return out


def launch_occupancy(launcher: Launcher, source: KernelSource, kernel: str, dtype: torch.dtype,
                     specialisation: tuple[str, ...], device: torch.device, threads: int):
    """The GPU's occupancy for launches of one instantiation, as ``_staged_launch`` weighs it:
    ``shared_bytes -> (blocks of threads an SM holds with that much dynamic shared memory, the
    GPU's SMs)`` (None where it cannot tell), from the launcher's ``occupancy`` (CuPy's asks the
    driver); None where the launcher has none (the recording and emulating ones), and the tiles
    are chosen without it."""
    ask = getattr(launcher, "occupancy", None)
    if ask is None:
        return None
    return lambda shared_bytes: ask(source, kernel, dtype, specialisation, device, threads, shared_bytes)


# ---------------------------------------------------------------------------------------
# involution_generated's forward on small maps (dense_window.cu's
# involution_generated_dense_window): a (sample, group) a block, the window a dense matrix
# ---------------------------------------------------------------------------------------

# float32 is declined: its products would be 3xTF32, not written yet; float64 has none.
DENSE_WINDOW_DTYPES = GENERATED_MMA_DTYPES


def dense_window_shared_bytes(source: KernelSource, inputs: int, taps: int, reduced: int, last: bool,
                              grad_input: bool = False) -> int:
    """``involution_generated_dense_window``'s dynamic shared memory (its comment's layout), or
    with ``grad_input`` its grad_input's: the larger of the feature and span rows and the two
    dense matrices, the staged input (grad_output), the taps' offsets, for a map of ``inputs``
    input pixels, ``taps`` taps and R = ``reduced``."""
    c = source.constants
    r_steps, q_steps, tap_rows = -(-reduced // 16), -(-inputs // 16), 16 * -(-taps // 16)
    reduced_stride, dense_stride = 8 * r_steps + 4, 8 * q_steps + 4
    feature = c["DENSE_PIXELS"] * reduced_stride if last else 16 * r_steps * c["DENSE_PIXEL_STRIDE"]
    if grad_input:
        staged = c["DENSE_PIXELS"] * c["DENSE_CHANNEL_STRIDE"] if last else c["DENSE_CHANNELS"] * c["DENSE_PIXEL_STRIDE"]
    else:
        staged = 16 * q_steps * c["DENSE_CHANNEL_STRIDE"] if last else c["DENSE_CHANNELS"] * dense_stride
    return 4 * (max(feature + tap_rows * reduced_stride, 2 * c["DENSE_PIXELS"] * dense_stride) + staged + 2 * c["DENSE_TAPS"])


def dense_window_config(source: KernelSource, dtype: torch.dtype, batch: int, groups: int, in_size, out_size,
                        kernel_size, reduced: int, last: bool, grad_input: bool = False,
                        dilation=(1, 1)) -> Optional[LaunchConfig]:
    """``involution_generated_dense_window``'s launch (``grad_input``: its grad_input's): a block
    of ``DENSE_WARPS`` warps per (group, sample); None where it does not serve the call (a dtype
    without the tensor-core product, more output pixels than ``DENSE_PIXELS``, no input pixel or
    more than ``DENSE_INPUTS``, taps than ``DENSE_TAPS``, an R of 0 or past ``DENSE_REDUCED``, a
    tap's offset past 16 bits (its (K - 1) * dilation: the kernel packs a tap's two in a word), a
    batch past CUDA's grid y limit)."""
    c = source.constants
    taps, inputs = kernel_size[0] * kernel_size[1], in_size[0] * in_size[1]
    if (dtype not in DENSE_WINDOW_DTYPES or out_size[0] * out_size[1] > c["DENSE_PIXELS"] or taps > c["DENSE_TAPS"]
            or not 1 <= inputs <= c["DENSE_INPUTS"] or not 1 <= reduced <= c["DENSE_REDUCED"] or batch > 65535
            or groups >= 2 ** 31 or max((k - 1) * d for k, d in zip(kernel_size, dilation)) >= 2 ** 16):
        return None
    return LaunchConfig((groups, batch), (32, c["DENSE_WARPS"]),
                        dense_window_shared_bytes(source, inputs, taps, reduced, last, grad_input))


def _vector_rows(tensor: Tensor, lanes: int, count: int) -> bool:
    """Whether a channels_last tensor's rows of ``count`` channels (per pixel) move as 16-byte
    vectors of ``lanes`` values: adjacent channels, every pixel's first aligned."""
    n_stride, c_stride, h_stride, w_stride = tensor.stride()
    return (c_stride == 1 and count % lanes == 0 and all(s % lanes == 0 for s in (n_stride, h_stride, w_stride))
            and tensor.data_ptr() % (lanes * tensor.element_size()) == 0)


def dense_window_vectors(input: Tensor, feature: Tensor, span_weight: Tensor, groups: int) -> bool:
    """``involution_generated_dense_window``'s VECTORS: span_weight's rows (R a multiple of the
    vector, aligned) and, where the input is channels_last, the feature's and the input's rows
    (``_vector_rows``: a group's channels and R a multiple of the vector) move as 16-byte vectors."""
    lanes = POLICY.lanes(input.dtype)
    reduced = feature.shape[1]
    span = reduced % lanes == 0 and span_weight.data_ptr() % (lanes * span_weight.element_size()) == 0
    return span and (not is_channels_last(input) or (_vector_rows(feature, lanes, reduced)
                                                     and _vector_rows(input, lanes, input.shape[1] // groups)))


def _launch_dense_window(kernel: str, activation: Tensor, feature: Tensor, span_weight: Tensor,
                         span_bias: Optional[Tensor], input_size, kernel_size, stride, padding, dilation, out: Tensor,
                         launcher: Optional[Launcher]) -> Optional[Tensor]:
    """``kernel`` of dense_window.cu, the forward ("involution_generated_dense_window",
    ``activation`` the input) or its grad_input ("..._backward_input", ``activation``
    grad_output), into ``out``: the launch both share, over the input's map ``input_size`` and
    the feature's; None, out untouched, where ``dense_window_config`` declines the call or the
    GPU predates sm_80. The instantiation is ``activation``'s layout's and
    ``dense_window_vectors``'s."""
    source = load_source(DENSE_WINDOW_SOURCE)
    n, channels = activation.shape[:2]
    groups = span_weight.shape[0] // (kernel_size[0] * kernel_size[1])
    grad_input = kernel.endswith("_backward_input")
    reduced, out_size = feature.shape[1], tuple((activation if grad_input else out).shape[2:])
    last = is_channels_last(activation)
    config = dense_window_config(source, activation.dtype, n, groups, tuple(input_size), out_size, kernel_size, reduced,
                                 last, grad_input=grad_input, dilation=dilation)
    if config is None or (activation.is_cuda
                          and torch.cuda.get_device_capability(activation.device) < GENERATED_MMA_MIN_CAPABILITY):
        return None
    if out.numel() == 0:
        return out
    span_weight = span_weight.contiguous()
    bias = span_weight.new_zeros(span_weight.shape[0]) if span_bias is None else span_bias.contiguous()
    vectors = dense_window_vectors(activation, feature, span_weight, groups)
    scalars = (channels, *input_size, groups, *kernel_size, *out_size, *stride, *padding, *dilation, reduced,
               *activation.stride(), *out.stride(), *feature.stride())
    (launcher or cupy_launcher()).launch(source, kernel, activation.dtype, config,
                                         (activation, feature, span_weight, bias, out, *scalars),
                                         tuple("true" if flag else "false" for flag in (last, vectors)))
    return out


def involution_generated_dense_window(input: Tensor, feature: Tensor, span_weight: Tensor,
                                      span_bias: Optional[Tensor], kernel_size, stride, padding, dilation, out: Tensor,
                                      launcher: Optional[Launcher] = None) -> Optional[Tensor]:
    """input: (N, C, H, W), feature: (N, R, Ho, Wo) -> out: (N, C, Ho, Wo), written by the dense
    window kernel in out's own strides (every operand of any strides); None, out untouched,
    where ``dense_window_config`` declines the call or the GPU predates sm_80. The
    instantiation is the input's layout's (channels_last or not: its staged layouts and
    fragment loads) and ``dense_window_vectors``'s."""
    return _launch_dense_window("involution_generated_dense_window", input, feature, span_weight, span_bias,
                                input.shape[2:], kernel_size, stride, padding, dilation, out, launcher)


def involution_generated_dense_window_backward_input(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                                     span_bias: Optional[Tensor], input_size, kernel_size, stride,
                                                     padding, dilation, out: Tensor,
                                                     launcher: Optional[Launcher] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo) -> out: grad_input (N, C, H, W),
    written by the dense window's grad_input kernel in out's own strides (every operand of any
    strides); None, out untouched, where ``dense_window_config`` declines the call or the GPU
    predates sm_80. The instantiation is grad_output's layout's and ``dense_window_vectors``'s."""
    return _launch_dense_window("involution_generated_dense_window_backward_input", grad_output, feature, span_weight,
                                span_bias, input_size, kernel_size, stride, padding, dilation, out, launcher)


def dense_weight_shared_bytes(source: KernelSource, inputs: int, last: bool, narrow: bool = False) -> int:
    """``involution_dense_window_backward_weight``'s dynamic shared memory (its comment's
    layout): the products (floats, or with ``narrow`` 16-bit values: one pass over a group's
    channels into the storage type), the staged grad_output and input, the taps' and the pixels'
    gather entries (4 words each), for a map of ``inputs`` input pixels."""
    c = source.constants
    q_steps = -(-inputs // 16)
    products = c["DENSE_PIXELS"] * (16 * q_steps + 8) // (2 if narrow else 1)
    if last:
        staged = (c["DENSE_PIXELS"] + 16 * q_steps) * c["DENSE_CHANNEL_STRIDE"]
    else:
        staged = c["DENSE_CHANNELS"] * (c["DENSE_PIXEL_STRIDE"] + 8 * q_steps + 4)
    return 4 * (products + staged + 4 * (c["DENSE_TAPS"] + c["DENSE_PIXELS"]))


def _band_inputs(in_size, rows: int, kernel_size, stride, dilation) -> int:
    """The most input pixels the windows of a band of ``rows`` output rows reach inside a map of
    ``in_size``: the pixels ``involution_dense_window_backward_weight`` stages for it."""
    return min(in_size[0], (rows - 1) * stride[0] + (kernel_size[0] - 1) * dilation[0] + 1) * in_size[1]


def dense_weight_band_rows(source: KernelSource, in_size, out_size, kernel_size, stride, dilation) -> Optional[int]:
    """The output rows of ``involution_dense_window_backward_weight``'s bands: the most whose
    pixels fit ``DENSE_PIXELS`` and the input rows their windows reach inside the map
    ``DENSE_INPUTS`` (the whole map where it fits); None where not even one row does."""
    c = source.constants
    for rows in range(min(out_size[0], c["DENSE_PIXELS"] // max(out_size[1], 1)), 0, -1):
        if _band_inputs(in_size, rows, kernel_size, stride, dilation) <= c["DENSE_INPUTS"]:
            return rows
    return None


def dense_weight_config(source: KernelSource, dtype: torch.dtype, batch: int, groups: int, in_size, out_size,
                        kernel_size, stride, last: bool, dilation=(1, 1), narrow: bool = False) -> Optional[LaunchConfig]:
    """``involution_dense_window_backward_weight``'s launch: a block of ``DENSE_WARPS`` warps per
    (group, sample, band of ``dense_weight_band_rows`` output rows); None where it does not serve
    the call (a dtype without the tensor-core product, no band that fits, no input pixel, more
    taps than ``DENSE_TAPS``, a tap's offset past 16 bits, a batch or bands past CUDA's grid
    limits). ``narrow``: the kernel keeps its products in 16 bits (``dense_weight_narrow``)."""
    c = source.constants
    rows = dense_weight_band_rows(source, in_size, out_size, kernel_size, stride, dilation)
    if (dtype not in DENSE_WINDOW_DTYPES or rows is None or in_size[0] * in_size[1] == 0
            or kernel_size[0] * kernel_size[1] > c["DENSE_TAPS"] or batch > 65535 or groups >= 2 ** 31
            or -(-out_size[0] // rows) > 65535 or max((k - 1) * d for k, d in zip(kernel_size, dilation)) >= 2 ** 16):
        return None
    return LaunchConfig((groups, batch, -(-out_size[0] // rows)), (32, c["DENSE_WARPS"]),
                        dense_weight_shared_bytes(source, _band_inputs(in_size, rows, kernel_size, stride, dilation),
                                                  last, narrow))


def dense_weight_narrow(source: KernelSource, dtype: torch.dtype, out_dtype: torch.dtype, channels: int,
                        groups: int) -> bool:
    """Whether ``involution_dense_window_backward_weight`` keeps its products in the storage type
    (its ``DENSE_MAP_NARROW``: one pass over a group's channels, an out in the activations' dtype)."""
    return out_dtype == dtype and channels // groups <= source.constants["DENSE_CHANNELS"]


def involution_dense_window_backward_weight(grad_output: Tensor, input: Tensor, kernel_size, stride, padding,
                                            dilation, groups: int, out: Tensor,
                                            launcher: Optional[Launcher] = None) -> Optional[Tensor]:
    """grad_output: (N, C, Ho, Wo), input: (N, C, H, W) -> out: grad_weight (N, G, KH, KW, Ho, Wo),
    written by ``dense_window.cu``'s grad_weight kernel (a (sample, group, band of output rows) a
    block, the products of grad_output and the input on tensor cores, gathered at the taps) in
    out's own strides
    (every operand of any strides); None, out untouched, where ``dense_weight_config`` declines
    the call, a group has no channel, out's offsets within a (sample, group) pass an int (the
    gather adds them in ints) or the GPU predates sm_80. ``out`` is in the activations' dtype or
    in float32 (``DENSE_MAP_WIDE``: the float sums as they are, the fused op's map). The instantiation is the
    input's layout's (channels_last or not) and, channels_last, whether both activations' rows
    move as 16-byte vectors (``_vector_rows``)."""
    source = load_source(DENSE_WINDOW_SOURCE)
    n, channels, height, width = input.shape
    out_size = tuple(grad_output.shape[2:])
    last = is_channels_last(input)
    narrow = dense_weight_narrow(source, input.dtype, out.dtype, channels, groups)
    config = dense_weight_config(source, input.dtype, n, groups, (height, width), out_size, kernel_size, stride, last,
                                 dilation=dilation, narrow=narrow)
    if out.dtype not in (input.dtype, torch.float32):
        raise ValueError(f"involution_dense_window_backward_weight: out is {out.dtype}, not {input.dtype} or float32")
    reach = sum((size - 1) * abs(step) for size, step in zip(out.shape[2:], out.stride()[2:]))
    if config is None or channels == 0 or reach >= 2**31 or (
            input.is_cuda and torch.cuda.get_device_capability(input.device) < GENERATED_MMA_MIN_CAPABILITY):
        return None
    if out.numel() == 0:
        return out
    lanes = POLICY.lanes(input.dtype)
    vectors = last and all(_vector_rows(t, lanes, channels // groups) for t in (grad_output, input))
    band_rows = dense_weight_band_rows(source, (height, width), out_size, kernel_size, stride, dilation)
    scalars = (channels, height, width, groups, *kernel_size, *out_size, *stride, *padding, *dilation, band_rows,
               *grad_output.stride(), *input.stride(), *out.stride())
    (launcher or cupy_launcher()).launch(source, "involution_dense_window_backward_weight", input.dtype, config,
                                         (grad_output, input, out, *scalars),
                                         (*("true" if flag else "false" for flag in (last, vectors)),
                                          "DENSE_MAP_WIDE" if out.dtype != input.dtype
                                          else "DENSE_MAP_NARROW" if narrow else "DENSE_MAP_ROUNDED"))
    return out


def generator_grads_through_dense_map(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor,
                                      kernel_size, stride, padding, dilation, out: tuple[Tensor, Tensor, Tensor],
                                      launcher: Optional[Launcher] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """involution_generated_backward_generator through the map gw as ``generator_grads_through_map``
    takes it, but gw written in float32 straight from the 16-bit operands by the dense window's
    grad_weight kernel (``involution_dense_window_backward_weight``, DENSE_MAP_WIDE: no float32 copies of
    grad_output and the input, and its float sums are the float32 kernels' products of the same
    values), then contracted the same way; None, out untouched, where the kernel declines."""
    n, _, out_h, out_w = feature.shape
    rows = span_weight.shape[0]
    groups = rows // (kernel_size[0] * kernel_size[1])
    if grad_output.dtype not in DENSE_WINDOW_DTYPES:
        return None
    gw = weight_result(grad_output.new_empty(0, dtype=torch.float32), (n, groups, *kernel_size, out_h, out_w),
                       is_channels_last(input))
    if involution_dense_window_backward_weight(grad_output, input, kernel_size, stride, padding, dilation, groups, gw,
                                               launcher) is None:
        return None
    return contract_generator_map_into(gw.reshape(n, rows, out_h, out_w), feature, span_weight, out)


# ---------------------------------------------------------------------------------------
# involution_generated's generator gradients on tensor cores (generated_mma.cu's
# involution_generated_mma_backward_generator): the map gw formed per tile in shared memory
# ---------------------------------------------------------------------------------------

# float16 is declined: the kernel's gw enters its products as two values of the storage type,
# and a gw past float16's 65504, which float32's map holds, would be an inf. float32's products
# are 3xTF32 (gw in float, each operand split as it is loaded).
GENERATED_MMA_GENERATOR_DTYPES = (torch.bfloat16, torch.float32)


def generated_mma_generator_narrow(source: KernelSource, out_w: int, reduced: int) -> bool:
    """Whether ``involution_generated_mma_backward_generator`` takes narrow tiles (8 columns,
    twice the R range): for a map at most 8 wide, whose row a 16-wide tile holds in twice the
    pixels; and where narrow tiles hold a row in as many pixels as 16-wide ones while R spans
    more than one 16-wide tile's range, whose gw a narrow tile forms once for twice the channels
    (14 wide, R 64: RedNet-50's third stage; the model puts it at about 0.8x of the 16-wide
    tiles there). Not where they would only save a few of a wide map's pixels (56 wide, R 16:
    a run of 8 forms 2 n-tiles of products where a run of 16 forms 3, and half of a narrow
    range's channels would be empty)."""
    tile_w = source.constants["MMA_TILE_W"]
    narrow_slots, wide_slots = tile_w // 2 * -(-out_w // (tile_w // 2)), tile_w * -(-out_w // tile_w)
    return out_w <= tile_w // 2 or (narrow_slots == wide_slots and reduced > source.constants["GEN_GRAD_R"])


def generated_mma_generator_tile(source: KernelSource, narrow: bool) -> tuple[int, int]:
    """(columns of a tile, channels of an R range) of the generator kernel, narrow or not."""
    c = source.constants
    return (c["MMA_TILE_W"] // 2, 2 * c["GEN_GRAD_R"]) if narrow else (c["MMA_TILE_W"], c["GEN_GRAD_R"])


def generated_mma_generator_extent(source: KernelSource, kernel_size, stride, dilation,
                                   narrow: bool = False) -> tuple[int, int]:
    """(rows, columns) of the input a tile of ``MMA_TILE_H`` output rows (of ``MMA_TILE_W``
    pixels, or narrow 8) stages, as the kernel computes them: its windows' rows, and their
    columns in whole n-tiles of 8."""
    c = source.constants
    tile_w = generated_mma_generator_tile(source, narrow)[0]
    rows = (c["MMA_TILE_H"] - 1) * stride[0] + (kernel_size[0] - 1) * dilation[0] + 1
    columns = (tile_w - 1) * stride[1] + (kernel_size[1] - 1) * dilation[1] + 1
    return rows, 8 * -(-columns // 8)


def generated_mma_generator_shared_bytes(source: KernelSource, kernel_size, stride, dilation,
                                         narrow: bool = False, dtype: torch.dtype = torch.bfloat16) -> int:
    """The dynamic shared memory of ``involution_generated_mma_backward_generator``: the group's
    span rows of the block's R range, the tile's feature, the staged input chunk (the warps'
    bias sums after it), the tile's gw in float and the flags (generated_mma.cu lays them out;
    float32's rows in floats, its input a k-step of ``GEN_GRAD_WIDE_CHANNELS`` at a time)."""
    c = source.constants
    tile_w, span_r = generated_mma_generator_tile(source, narrow)
    rows, columns = generated_mma_generator_extent(source, kernel_size, stride, dilation, narrow)
    tap_pad = 16 * -(-kernel_size[0] * kernel_size[1] // 16)
    if dtype == torch.float32:
        tap_stride, pixels = tap_pad + c["GEN_GRAD_WIDE_PAD"], c["MMA_WARPS"] * tile_w
        return 4 * (span_r * tap_stride + span_r * (pixels + 4) + rows * columns * c["GEN_GRAD_WIDE_CHANNELS"]
                    + pixels * tap_stride + 3)
    pixel_words = c["MMA_WARPS"] * tile_w // 2 + 4
    return 4 * (span_r * (tap_pad // 2 + 4) + span_r * pixel_words + rows * columns * c["GEN_GRAD_COLUMN_WORDS"]
                + c["MMA_WARPS"] * tile_w * (tap_pad + 4) + 2)


# Fewer blocks of tiles x R ranges x samples than this, and the generator kernel's groups are
# split among more (a fixed count, not the GPU's: grad_feature's bits do not depend on the GPU).
GENERATOR_SPLIT_BLOCKS = 512


def generated_mma_generator_splits(blocks: int, groups: int) -> int:
    """How many blocks share a (tile, R range, sample)'s groups: 1 where the grid of those has
    ``GENERATOR_SPLIT_BLOCKS`` blocks or more, else the fewest splits that bring it there, at
    most one a group."""
    if blocks >= GENERATOR_SPLIT_BLOCKS:
        return 1
    return max(1, min(groups, -(-GENERATOR_SPLIT_BLOCKS // max(blocks, 1))))


def generated_mma_generator_config(source: KernelSource, dtype: torch.dtype, batch: int, reduced: int, out_size,
                                   kernel_size, stride, dilation, groups: int = 1,
                                   group_splits: Optional[int] = None) -> Optional[LaunchConfig]:
    """``involution_generated_mma_backward_generator``'s launch: a block of ``MMA_WARPS`` warps
    per tile of ``MMA_TILE_H`` x ``MMA_TILE_W`` output pixels of a sample and ``GEN_GRAD_R`` of
    R's channels (narrow, ``generated_mma_generator_narrow``: 8 columns and twice the channels)
    and a split of the groups (``group_splits``, by default ``generated_mma_generator_splits``'s;
    grid y: the R ranges times the splits); None where it does not serve the call (a dtype it
    declines, more taps than ``MMA_TAPS``, windows of a run spanning more than ``MMA_BAND``
    columns, shared memory past ``GENERATED_TILE_MAX_SHARED``, a grid past CUDA's y and z
    limits)."""
    c = source.constants
    if dtype not in GENERATED_MMA_GENERATOR_DTYPES or kernel_size[0] * kernel_size[1] > c["MMA_TAPS"]:
        return None
    narrow = generated_mma_generator_narrow(source, out_size[1], reduced)
    if generated_mma_generator_extent(source, kernel_size, stride, dilation, narrow)[1] > c["MMA_BAND"]:
        return None
    shared_bytes = generated_mma_generator_shared_bytes(source, kernel_size, stride, dilation, narrow, dtype)
    tile_w, span_r = generated_mma_generator_tile(source, narrow)
    ranges = -(-reduced // span_r)
    tiles = -(-out_size[0] // c["MMA_TILE_H"]) * -(-out_size[1] // tile_w)
    splits = group_splits or generated_mma_generator_splits(tiles * ranges * batch, groups)
    if shared_bytes > GENERATED_TILE_MAX_SHARED or ranges * splits > 65535 or batch > 65535:
        return None
    return LaunchConfig((tiles, ranges * splits, batch), (32, c["MMA_WARPS"]), shared_bytes)


def generated_mma_generator_parts(source: KernelSource, config: LaunchConfig, batch: int, reduced: int,
                                  out_w: int) -> tuple[int, int]:
    """(slots, splits) of ``involution_generated_mma_backward_generator``'s launch ``config``: its
    float32 partial sums of grad_span_weight and grad_span_bias, a slot per tile and sample, and
    the group splits, whose parts of grad_feature torch adds up where there is more than one."""
    span_r = generated_mma_generator_tile(source, generated_mma_generator_narrow(source, out_w, reduced))[1]
    return config.grid[0] * batch, config.grid[1] // -(-reduced // span_r)


def generated_mma_grad_words(grad_output: Tensor, groups: int) -> bool:
    """Whether the kernel may load grad_output's pairs of a group's channels (c, c + 1; c even)
    as one aligned 32-bit word: channels_last with an even count of channels a group, every
    pixel's channels starting at an even element of a 4-byte aligned tensor."""
    return generated_mma_feature_words(grad_output) and (grad_output.shape[1] // groups) % 2 == 0


def involution_generated_mma_backward_generator(grad_output: Tensor, feature: Tensor, span_weight: Tensor,
                                                input: Tensor, kernel_size, stride, padding, dilation,
                                                out: tuple[Tensor, Tensor, Tensor],
                                                launcher: Optional[Launcher] = None, specialised: bool = True,
                                                group_splits: Optional[int] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """grad_output: (N, C, Ho, Wo), feature: (N, R, Ho, Wo), span_weight: (G*KH*KW, R), input:
    (N, C, H, W) -> out: (grad_feature (N, R, Ho, Wo) in its own strides, grad_span_weight
    (G*KH*KW, R), grad_span_bias (G*KH*KW,)), involution_generated_backward_generator by the
    tensor-core kernel: grad_feature written by it, the other two from its partial sums in
    float32 (a slot per tile and sample: (tiles * N, G*KH*KW, R) and (tiles * N, G*KH*KW)),
    added up here over the slots by torch's sum, which is deterministic; where the groups are
    split among blocks (``group_splits``, by default the config's), grad_feature from the
    splits' parts in float32, (splits, N, Ho, Wo, R), added up the same way. None, out
    untouched, where ``generated_mma_generator_config`` declines the call or the GPU predates
    sm_80. ``specialised`` as ``involution_generated_mma``'s."""
    source = load_source(GENERATED_MMA_SOURCE)
    n, channels = grad_output.shape[:2]
    rows, reduced = span_weight.shape
    groups = rows // (kernel_size[0] * kernel_size[1])
    out_size = tuple(grad_output.shape[2:])
    config = generated_mma_generator_config(source, grad_output.dtype, n, reduced, out_size, kernel_size, stride,
                                            dilation, groups, group_splits)
    if config is None or (grad_output.is_cuda
                          and torch.cuda.get_device_capability(grad_output.device) < GENERATED_MMA_MIN_CAPABILITY):
        return None
    grad_feature, grad_span_weight, grad_span_bias = out
    if grad_feature.numel() == 0:
        grad_span_weight.zero_()
        grad_span_bias.zero_()
        return out
    narrow = generated_mma_generator_narrow(source, out_size[1], reduced)
    tile_w = generated_mma_generator_tile(source, narrow)[0]
    slots, splits = generated_mma_generator_parts(source, config, n, reduced, out_size[1])
    span_sums = torch.empty((slots, rows, reduced), dtype=torch.float32, device=grad_output.device)
    bias_sums = torch.empty((slots, rows), dtype=torch.float32, device=grad_output.device)
    feature_parts = torch.empty((splits, n, *out_size, reduced) if splits > 1 else (0,), dtype=torch.float32,
                                device=grad_output.device)
    tiles_w = -(-out_size[1] // tile_w)
    scalars = (channels, *input.shape[2:], groups, *kernel_size, *out_size, *stride, *padding, *dilation, reduced,
               tiles_w, *grad_output.stride(), *input.stride(), *feature.stride(), *grad_feature.stride(),
               generated_mma_vectors_fit(input, groups), generated_mma_grad_words(grad_output, groups))
    kernel = "involution_generated_mma_backward_generator"
    window = (generated_tile_specialisation(source, kernel_size, stride, dilation, kernel) if specialised
              else GENERATED_TILE_RUNTIME)
    specialisation = (*window, "true" if narrow else "false")
    (launcher or cupy_launcher()).launch(source, kernel, grad_output.dtype, config,
                                         (grad_output, input, feature, span_weight.contiguous(), grad_feature,
                                          feature_parts, span_sums, bias_sums, splits, *scalars), specialisation)
    if splits > 1:
        grad_feature.copy_(feature_parts.sum(0).permute(0, 3, 1, 2))
    grad_span_weight.copy_(span_sums.sum(0))
    grad_span_bias.copy_(bias_sums.sum(0))
    return out


# Whether involution_generated_backward_generator's CUDA path takes the tensor-core kernel where it
# serves the call. Not before a draw has timed it beside the map route: the offline model
# (bench/results/cuda-model.md) puts it issue-bound, ahead of the map route's float32 grad_weight
# alone at RedNet-50's stages 1-3 in channels_last and behind it at stage 4; with the map route's
# copies and cuBLAS contractions at their DRAM floor (no kernels the model traces), and torch's
# sums of the kernel's partial sums at theirs, ahead of the whole route at every bfloat16 row but
# stage 4's (channels_last at stride 2 aside), and in float32 (3xTF32, about twice bfloat16's
# time) at about a third of the rows, behind it at stage 4 (the page's forward + backward
# section). The kernel table times it in the "generator grads" row's "tensor cores" column.
GENERATOR_ON_TENSOR_CORES = False


def involution_generated_backward_generator(grad_output: Tensor, feature: Tensor, span_weight: Tensor, input: Tensor,
                                            kernel_size, stride, padding, dilation,
                                            out: tuple[Tensor, Tensor, Tensor], launcher: Optional[Launcher] = None,
                                            tensor_cores: Optional[bool] = None) -> tuple[Tensor, Tensor, Tensor]:
    """involution_generated_backward_generator's CUDA writer: the map route
    (``generator_grads_through_map``: gw written in float32 by involution's grad_weight kernels,
    then contracted by cuBLAS), under the ``dense_window`` policy the map in float32 by the dense
    window's grad_weight kernel where it serves the call (``generator_grads_through_dense_map``),
    or with ``tensor_cores`` (by default ``GENERATOR_ON_TENSOR_CORES``) the tensor-core kernel where it serves the call
    (``involution_generated_mma_backward_generator``: bfloat16, and float32 in 3xTF32, on sm_80 and
    newer, the map never written)."""
    kernel = GENERATOR_ON_TENSOR_CORES if tensor_cores is None else tensor_cores
    if POLICY.dense_window and generator_grads_through_dense_map(grad_output, feature, span_weight, input, kernel_size,
                                                                 stride, padding, dilation, out, launcher) is not None:
        return out
    if kernel and involution_generated_mma_backward_generator(grad_output, feature, span_weight, input, kernel_size,
                                                              stride, padding, dilation, out, launcher) is not None:
        return out
    return generator_grads_through_map(grad_output, feature, span_weight, input, kernel_size, stride, padding, dilation,
                                       out)


# ---------------------------------------------------------------------------------------
# Tuning's candidates: the writers each op's CUDA kernel times beside its own choice where
# tuning is on (oplib.kernels.cuda_plan), each called (*op args, out, launcher) and returning
# None where it declines the call. They are the kernels proven offline and timed by the kernel
# table beside the op's choice, which no draw has yet made a default: the policies' other
# kernels, and the fused op's tiled, staged, dense-window and tensor-core kernels.
# ---------------------------------------------------------------------------------------


def _under(writer: Callable, policy: LaunchPolicy) -> Callable:
    return functools.partial(writer, policy=policy)


DENSE_WINDOW_POLICY = dataclasses.replace(POLICY, dense_window=True)

TUNING_CANDIDATES: dict[str, dict[str, Callable]] = {
    "oplib::involution": {
        "chunked": _under(involution, CHUNKED),
        "vectors, narrow": _under(involution, VECTORS_NARROW),
        "vectors, wide": _under(involution, VECTORS_WIDE),
        "lanes on channels, pairs": _under(involution, LAST_PAIRS),
        "lanes on channels, a pixel a lane": _under(involution, LAST_ONE_PIXEL),
    },
    "oplib::involution_backward_input": {
        "chunked": _under(involution_backward_input, CHUNKED),
        "lanes on channels, segments": _under(involution_backward_input, LAST),
        "lanes on channels, a vector a thread": _under(involution_backward_input, LAST_VECTOR_GRAD_INPUT),
    },
    "oplib::involution_backward_weight": {
        "chunked": _under(involution_backward_weight, CHUNKED),
        "lanes on channels, pairs": _under(involution_backward_weight, LAST_PAIRS),
        "lanes on channels, a pixel a lane": _under(involution_backward_weight, LAST_ONE_PIXEL),
        "dense window": _under(involution_backward_weight, DENSE_WINDOW_POLICY),
    },
    "oplib::involution_generated": {
        "tensor cores": involution_generated_mma,
        "tiled": involution_generated_tile,
        "staged": involution_generated_mma_staged,
        "dense window": involution_generated_dense_window,
    },
    "oplib::involution_generated_backward_input": {
        "generic": involution_generated_backward_input_generic,
        "tensor cores": involution_generated_mma_backward_input,
        "staged": involution_generated_mma_backward_input_staged,
        "dense window": involution_generated_dense_window_backward_input,
    },
    "oplib::involution_generated_backward_generator": {
        "tensor cores": involution_generated_mma_backward_generator,
        "dense map": generator_grads_through_dense_map,
    },
}
