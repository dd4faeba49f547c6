"""A/B on a GPU: involution.cu's channels_last grad_weight before (one pixel a thread, the
sixth draw's kernel) and after (a run of pixels a thread), at RedNet-50's shapes, batch 32,
bfloat16 and float32: device time of CUDA graph replays, interleaved rounds; and the results'
bits compared."""
import dataclasses, json, os, statistics, sys
from pathlib import Path
import torch
from oplib.benchmark import REDNET50_SHAPES, capture_graph
from oplib.kernels import KernelSource, cupy_launcher
from oplib.kernels.involution import cuda as ic
from oplib.kernels.involution.layouts import weight_result

def _source(name):
    path = Path(__file__).with_name(name)
    return KernelSource(path, path.read_text())


OLD = _source("involution_before.cu")
OLD_POLICY = dataclasses.replace(ic.POLICY, weight_run=1, weight_run_wide=1, vectors=False)
RUN2 = _source("involution_run2.cu")
RUN2_POLICY = dataclasses.replace(ic.POLICY, weight_run=2, weight_run_wide=2)
real_load = ic.load_source
# name -> (the source of involution.cu to launch, its policy); "after" is the committed source
VARIANTS = {"before": (OLD, OLD_POLICY), "run2": (RUN2, RUN2_POLICY), "after": (None, ic.POLICY)}


def main():
    out_dir = Path(os.environ.get("OUT", "."))
    launcher = cupy_launcher()
    rows = []
    for shape in REDNET50_SHAPES:
        shape = dataclasses.replace(shape, batch=32)
        stride, padding, dilation = shape.params
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(32, shape.channels, shape.height, shape.width, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
            oh = (shape.height + 2 * padding[0] - shape.kernel) // stride[0] + 1
            ow = (shape.width + 2 * padding[1] - shape.kernel) // stride[1] + 1
            g = torch.randn(32, shape.channels, oh, ow, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
            ks = [shape.kernel] * 2
            wshape = (32, shape.groups, *ks, oh, ow)
            outs = {k: weight_result(g, wshape, True) for k in VARIANTS}

            def call(name):
                source, policy = VARIANTS[name]
                def run():
                    if source is not None:
                        ic.load_source = lambda n: source if n == ic.SOURCE else real_load(n)
                    try:
                        ic.involution_backward_weight(g, x, ks, stride, padding, dilation, shape.groups, outs[name],
                                                      launcher, policy)
                    finally:
                        ic.load_source = real_load
                return run
            graphs = {k: capture_graph(call(k)) for k in VARIANTS}
            bits = torch.int16 if dtype.itemsize == 2 else torch.int32
            same = all(torch.equal(outs["before"].view(bits), outs[k].view(bits)) for k in VARIANTS)
            times = {k: [] for k in graphs}
            keys = list(VARIANTS)
            for r in range(9):
                for k in keys[r % 3:] + keys[:r % 3]:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record(); graphs[k].replay(); end.record(); end.synchronize()
                    times[k].append(start.elapsed_time(end) / 20 * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append({"shape": shape.name, "dtype": str(dtype).removeprefix("torch."),
                         **{f"{k}_us": med[k] for k in VARIANTS}, "run4 / before": med["after"] / med["before"],
                         "run2 / before": med["run2"] / med["before"], "same_bits": same})
            print(rows[-1], flush=True)
            (out_dir / "ab-grad-weight.json").write_text(json.dumps(rows, indent=1))
            del graphs


if __name__ == "__main__":
    main()
