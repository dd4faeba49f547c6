"""``python -m oplib train``: a narrow RedNet-26 trained with torch.compile on scikit-learn's
8x8 handwritten digits (1797 images shipped inside the scikit-learn package: nothing is
downloaded), with a fixed held-out split.

Writes to ``--out``: ``checkpoint.pt`` (model, optimizer, schedule, step, history; ``--resume``
continues from it), ``curve.png`` (loss and accuracy per epoch) and ``model.pt2`` (a
torch.export program of the trained model, dynamic batch), which is reloaded and must
reach exactly the eager model's held-out accuracy.

Data-parallel: ``torchrun --nproc-per-node=N -m oplib train`` runs the same training under
DistributedDataParallel (gloo on CPU, nccl on CUDA); each process takes its share of every
global batch through a DistributedSampler. BatchNorm normalises over each process's share,
as DDP does. ``--emulate-world-size N`` reproduces such a run in one process: every step
runs the N shares as separate forwards and averages their losses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from ._cli import parser as cli_parser, positive, require_extra
from ._extras import require
from .models import BLOCK_COUNTS, RedNet

SPLIT_SEED = 20210617  # fixes the held-out split, whatever --seed is
TEST_FRACTION = 0.2
IMAGE_SIZE = 32  # the digits are upsampled so that RedNet's five stride-2 steps end at 1x1


def _block_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(b) for b in text.split(","))
    except ValueError:
        counts = ()
    if len(counts) != 4 or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected four positive counts separated by commas, got {text!r}")
    return counts


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and validate the flags: a bad value exits with code 2 and a one-line message."""
    positive_int, positive_float = positive(int), positive(float)
    parser = cli_parser("python -m oplib train", __doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/digits"), help="output directory")
    parser.add_argument("--epochs", type=positive_int, default=30, help="passes over the training split (default 30)")
    parser.add_argument("--steps", type=positive_int, default=None, help="stop after this many optimizer steps in total")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="global batch size (split across processes)")
    parser.add_argument("--lr", type=positive_float, default=0.1, help="peak learning rate of SGD (default 0.1)")
    parser.add_argument("--width", type=positive_int, default=16, help="RedNet width (64 in the paper)")
    parser.add_argument("--group-channels", type=positive_int, default=8, help="channels per involution group (default 8; 16 in the paper)")
    parser.add_argument("--blocks", type=_block_counts, default=(1, 2, 4, 1), help="bottlenecks per stage (RedNet-26: 1,2,4,1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the batch order (default 0)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="train in eager mode")
    parser.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    parser.add_argument("--no-export", dest="export", action="store_false", help="skip the torch.export check")
    parser.add_argument(
        "--emulate-world-size", type=positive_int, default=1, help="reproduce an N-process run in one process"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    require_extra(parser, "train")
    if args.resume and not (args.out / "checkpoint.pt").is_file():
        parser.error(f"--resume: no checkpoint at {args.out / 'checkpoint.pt'} (a run with --out {args.out} writes it)")
    if args.batch_size % args.emulate_world_size:
        parser.error(f"--batch-size {args.batch_size} must be divisible by --emulate-world-size {args.emulate_world_size}")
    images = len(load_digits().train_labels)
    if args.batch_size > images:
        parser.error(f"--batch-size {args.batch_size} is larger than the {images} training images")
    try:
        with torch.device("meta"):  # the model's own checks, without allocating it
            build_model(args)
    except ValueError as error:
        parser.error(str(error))
    return args


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------


@dataclass
class Digits:
    train_images: torch.Tensor  # (N, 1, 32, 32), normalised
    train_labels: torch.Tensor  # (N,)
    test_images: torch.Tensor
    test_labels: torch.Tensor
    background: float  # a blank pixel, normalised (the data's minimum)


def load_digits() -> Digits:
    datasets = require("sklearn.datasets", "train", "python -m oplib train (the digits data set)")
    data = datasets.load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    test_count = int(round(TEST_FRACTION * len(labels)))
    test, train = order[:test_count], order[test_count:]
    mean, std = images[train].mean(), images[train].std()
    images = (images - mean) / std
    return Digits(images[train], labels[train], images[test], labels[test], images.min().item())


MAX_SHIFT = 3  # pixels of random translation (of the 32x32 image) in training


def shifted(images: torch.Tensor, shifts: torch.Tensor, background: float) -> torch.Tensor:
    """images: (B, 1, S, S), shifts: (B, 2) in [-MAX_SHIFT, MAX_SHIFT] -> each image translated
    by its shift, the uncovered pixels set to ``background``."""
    size = images.shape[-1]
    padded = F.pad(images, (MAX_SHIFT,) * 4, value=background)
    base = torch.arange(size, device=images.device) + MAX_SHIFT
    rows = (base - shifts[:, :1]).unsqueeze(2)  # (B, S, 1)
    cols = (base - shifts[:, 1:]).unsqueeze(1)  # (B, 1, S)
    batch = torch.arange(len(images), device=images.device).view(-1, 1, 1)
    return padded[batch, 0, rows, cols].unsqueeze(1)


def epoch_shifts(count: int, epoch: int, seed: int) -> torch.Tensor:
    """Every training image's shift in one epoch: a function of (seed, epoch) only, so a
    resumed run and every process of a distributed run see the same augmentation."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (count, 2), generator=generator)


def shard_batches(count: int, batch_size: int, epoch: int, seed: int, world: int, rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s index batches for one epoch: a DistributedSampler's share of a shuffled
    epoch, cut into batch_size // world per step (the last, partial, global batch dropped)."""
    sampler = DistributedSampler(range(count), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    indices = torch.tensor(list(sampler))
    share = batch_size // world
    steps = len(indices) // share
    return [indices[i * share : (i + 1) * share] for i in range(steps)]


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------


def build_model(args: argparse.Namespace) -> RedNet:
    torch.manual_seed(args.seed)
    return RedNet(args.blocks, num_classes=10, in_channels=1, width=args.width, group_channels=args.group_channels)


@torch.no_grad()
def accuracy(model, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 512) -> float:
    correct = 0
    for start in range(0, len(labels), batch_size):
        logits = model(images[start : start + batch_size])
        correct += (logits.argmax(1) == labels[start : start + batch_size]).sum().item()
    return correct / len(labels)


def _save_curve(history: list[dict], path: Path) -> None:
    matplotlib = require("matplotlib", "train", "python -m oplib train (the training curve)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(epochs, [h["train_loss"] for h in history], marker="o")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    right.plot(epochs, [h["train_accuracy"] for h in history], marker="o", label="train")
    right.plot(epochs, [h["test_accuracy"] for h in history], marker="o", label="held-out")
    right.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(0, 1))
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _export_and_check(model: RedNet, data: Digits, out: Path, eager_accuracy: float) -> float:
    from torch.export import Dim

    model.eval()
    program = torch.export.export(model, (data.test_images[:4],), dynamic_shapes={"x": {0: Dim("batch", max=4096)}})
    torch.export.save(program, out / "model.pt2")
    loaded = torch.export.load(out / "model.pt2").module()
    exported_accuracy = accuracy(loaded, data.test_images, data.test_labels)
    if exported_accuracy != eager_accuracy:
        raise RuntimeError(f"exported program's accuracy {exported_accuracy} differs from the eager model's {eager_accuracy}")
    return exported_accuracy


def train(args: argparse.Namespace) -> dict:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1
    if distributed:
        if args.emulate_world_size != 1:
            raise ValueError("--emulate-world-size is for single-process runs")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank = dist.get_rank()
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        rank = 0
    shares = world if distributed else args.emulate_world_size
    if args.batch_size % shares:
        raise ValueError(f"--batch-size {args.batch_size} must be divisible by the {shares} processes")
    main_process = rank == 0
    args.out.mkdir(parents=True, exist_ok=True)

    data = load_digits()
    model = build_model(args).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    steps_per_epoch = len(data.train_labels) // args.batch_size
    # The schedule spans all epochs; --steps only stops the run early (a later --resume
    # continues it on the same schedule).
    total_steps = args.epochs * steps_per_epoch
    stop_at = total_steps if args.steps is None else min(args.steps, total_steps)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=max(total_steps, 1), pct_start=0.15)
    history, step = [], 0
    checkpoint_path = args.out / "checkpoint.pt"
    if args.resume:
        checkpoint = torch.load(checkpoint_path, map_location=device, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        schedule.load_state_dict(checkpoint["schedule"])
        history, step = checkpoint["history"], checkpoint["step"]
        if main_process:
            print(f"resumed from {checkpoint_path} at step {step} (epoch {step // steps_per_epoch + 1})")

    trained = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    forward = torch.compile(trained) if args.compile else trained
    images, labels = data.train_images.to(device), data.train_labels.to(device)
    test_images, test_labels = data.test_images.to(device), data.test_labels.to(device)
    start = time.perf_counter()
    if main_process and args.compile:
        print("the first step compiles the model, so it takes far longer than the steps after it", flush=True)
    record = None
    while step < stop_at:
        epoch, done_in_epoch = divmod(step, steps_per_epoch)
        model.train()
        ranks = [rank] if distributed else list(range(shares))
        batches = list(zip(*(shard_batches(len(labels), args.batch_size, epoch, args.seed, shares, r) for r in ranks)))
        batches = batches[done_in_epoch : done_in_epoch + stop_at - step]
        shifts = epoch_shifts(len(labels), epoch, args.seed).to(device)
        progress = _progress(batches, f"epoch {epoch + 1}/{args.epochs}", disable=args.quiet or not main_process)
        loss_sum = correct = seen = 0.0
        for batch in progress:
            optimizer.zero_grad(set_to_none=True)
            for share in batch:  # one share per process (several when emulating)
                logits = forward(shifted(images[share], shifts[share], data.background))
                loss = F.cross_entropy(logits, labels[share], label_smoothing=0.1) / len(batch)
                loss.backward()
                loss_sum += loss.item() * len(batch) * len(share)
                correct += (logits.argmax(1) == labels[share]).sum().item()
                seen += len(share)
            optimizer.step()
            schedule.step()
            step += 1
            if hasattr(progress, "set_postfix"):
                progress.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}")
        model.eval()
        record = {
            "epoch": epoch + 1,
            "step": step,
            "train_loss": loss_sum / max(seen, 1),
            "train_accuracy": correct / max(seen, 1),
            "test_accuracy": accuracy(model, test_images, test_labels),
            "seconds": time.perf_counter() - start,
        }
        complete = step % steps_per_epoch == 0
        if complete:  # a run stopped inside an epoch reports it, and records it once finished
            history.append(record)
        if main_process:
            print(
                f"epoch {record['epoch']}{'' if complete else ' (stopped inside it)'}: loss {record['train_loss']:.4f}, train accuracy {record['train_accuracy']:.4f}, "
                f"held-out accuracy {record['test_accuracy']:.4f} ({record['seconds']:.0f} s)",
                flush=True,
            )
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "history": history,
                "step": step,
                "args": vars(args) | {"out": str(args.out)},
            }
            torch.save(state, checkpoint_path)
            _save_curve(history if complete else history + [record], args.out / "curve.png")

    summary = {"steps": step, "seconds": time.perf_counter() - start, "world_size": world}
    if record is not None:
        summary["test_accuracy"] = record["test_accuracy"]
    if main_process and args.export and record is not None:
        summary["exported_test_accuracy"] = _export_and_check(model, data, args.out, record["test_accuracy"])
        print(f"exported program {args.out / 'model.pt2'}: held-out accuracy {summary['exported_test_accuracy']:.4f} (equal to eager)")
    if main_process:
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    if distributed:
        dist.destroy_process_group()
    return summary


def _progress(items, description: str, disable: bool):
    tqdm = require("tqdm", "train", "python -m oplib train (the progress bar)").tqdm
    return tqdm(items, desc=description, disable=disable, leave=False, file=sys.stdout, mininterval=0.5)


def main(argv: list[str]) -> int:
    train(parse_args(argv))
    return 0


__all__ = ["BLOCK_COUNTS", "Digits", "build_model", "load_digits", "main", "shard_batches", "train"]
