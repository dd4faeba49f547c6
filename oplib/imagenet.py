"""ImageNet with pretrained RedNets: the reference code's test preprocessing, an ImageNet-style
validation folder, the 1000 class names, and two commands.

    python -m oplib evaluate --depth 50 --weights paddleclas DATA_DIR   # top-1 / top-5 accuracy
    python -m oplib evaluate --depth 50 --weights FILE DATA_DIR   # a .pdparams, mmcls or oplib file
    python -m oplib evaluate --depth 50 --weights imagenet DATA_DIR   # an alias of paddleclas
    python -m oplib predict --depth 50 --weights FILE IMAGE...    # the top-5 classes per image

The preprocessing is the test pipeline of the paper's configs (mmcls ``imagenet_bs32``): the
image as 0-255 RGB, its short side resized to 256 (bilinear, OpenCV's convention: half-pixel
centres, no antialiasing, rounded back to 8 bits), a centred 224x224 crop, then
(x - mean) / std per channel with the mean and std below.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ._cli import parser as cli_parser, require_extra
from ._extras import require
from .checkpoints import accepted_weights, weights_argument
from .models import BLOCK_COUNTS, PRETRAINED_CFGS, RedNet, rednet


def settings(cfg: dict) -> tuple[int, int, tuple[float, ...], tuple[float, ...]]:
    """A ``pretrained_cfg``'s test preprocessing: (short side before the crop, crop, mean,
    std), the mean and std per RGB channel on 0-255 values."""
    crop = cfg["input_size"][-1]
    return (
        round(crop / cfg["crop_pct"]),
        crop,
        tuple(round(255 * m, 6) for m in cfg["mean"]),
        tuple(round(255 * s, 6) for s in cfg["std"]),
    )


# Every depth's checkpoint shares these (the reference configs' img_norm_cfg): 256, 224,
# (123.675, 116.28, 103.53), (58.395, 57.12, 57.375).
RESIZE, CROP, MEAN, STD = settings(PRETRAINED_CFGS[50])
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff"}


@cache
def class_names() -> tuple[tuple[str, str], ...]:
    """The 1000 ImageNet-1k classes in index order: (WordNet ID, names). Where the list comes
    from is said at the top of ``oplib/data/imagenet_classes.tsv``."""
    text = resources.files("oplib").joinpath("data/imagenet_classes.tsv").read_text()
    rows = tuple(tuple(line.split("\t", 1)) for line in text.splitlines() if line and not line.startswith("#"))
    if len(rows) != 1000:
        raise RuntimeError(f"oplib/data/imagenet_classes.tsv: expected 1000 classes, found {len(rows)}")
    return rows


def load_image(path: str | os.PathLike) -> Tensor:
    """An image file as (3, H, W) uint8 RGB, decoded by Pillow."""
    Image = require("PIL.Image", "models", "decoding images (oplib.imagenet.load_image)")
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        width, height = rgb.size
        data = bytearray(rgb.tobytes())
    return torch.frombuffer(data, dtype=torch.uint8).view(height, width, 3).permute(2, 0, 1).contiguous()


def resize_short_side(image: Tensor, size: int) -> Tensor:
    """image: (3, H, W) uint8 -> (3, h, w) uint8 with min(h, w) = size and the other side
    int(size * long / short), bilinear as OpenCV's INTER_LINEAR computes it (half-pixel
    centres, no antialiasing), rounded to the nearest level. An image whose short side is
    already ``size`` is returned as it is."""
    height, width = image.shape[-2:]
    if (width <= height and width == size) or (height <= width and height == size):
        return image
    if width < height:
        new_height, new_width = int(size * height / width), size
    else:
        new_height, new_width = size, int(size * width / height)
    resized = F.interpolate(image[None].float(), size=(new_height, new_width), mode="bilinear", align_corners=False)
    return resized[0].round().clamp(0, 255).to(torch.uint8)


def center_crop(image: Tensor, size: int) -> Tensor:
    """image: (3, H, W) -> (3, size, size) from the centre (offsets rounded as Python rounds
    (H - size) / 2, as the reference's CenterCrop does); a side shorter than ``size`` is kept whole."""
    height, width = image.shape[-2:]
    top, left = max(0, int(round((height - size) / 2))), max(0, int(round((width - size) / 2)))
    return image[:, top : top + size, left : left + size]


def normalize(image: Tensor) -> Tensor:
    """image: (3, H, W) 0-255 RGB -> float32 (x - MEAN) / STD per channel."""
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (image.float() - mean) / std


def preprocess(image: Tensor, resize: int = RESIZE, crop: int = CROP) -> Tensor:
    """image: (3, H, W) uint8 RGB -> the model's input (3, crop, crop) float32."""
    return normalize(center_crop(resize_short_side(image, resize), crop))


class ImageFolder(torch.utils.data.Dataset):
    """An ImageNet-style folder: one subfolder per class, named by its WordNet ID, holding that
    class's images. Labels are the classes' ImageNet indices (the sorted WNIDs, so a full
    validation folder's sorted subfolders are 0..999; a folder with some classes only keeps
    their ImageNet indices). Items: (preprocessed image, label)."""

    def __init__(self, root: str | os.PathLike, limit: Optional[int] = None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"{self.root} is not a directory")
        index = {wnid: i for i, (wnid, _) in enumerate(class_names())}
        folders = sorted(p for p in self.root.iterdir() if p.is_dir())
        unknown = [p.name for p in folders if p.name not in index]
        if not folders or unknown:
            raise ValueError(
                f"{self.root}: expected one subfolder per class named by its WordNet ID (e.g. n01440764), "
                + (f"found {unknown[:3]}" if unknown else "found none")
            )
        self.samples = [
            (path, index[folder.name])
            for folder in folders
            for path in sorted(folder.iterdir())
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if limit is not None:
            self.samples = self.samples[:limit]
        if not self.samples:
            raise ValueError(f"{self.root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        path, label = self.samples[i]
        return preprocess(load_image(path)), label


@torch.no_grad()
def evaluate(model: RedNet, loader, progress: bool = True) -> dict:
    """Top-1 and top-5 accuracy of ``model`` over ``loader``'s (images, labels) batches."""
    tqdm = require("tqdm", "models", "oplib.imagenet.evaluate's progress bar").tqdm

    model.eval()
    seen = top1 = top5 = 0
    bar = tqdm(loader, desc="evaluate", disable=not progress, file=sys.stderr, mininterval=0.5)
    for images, labels in bar:
        best5 = model(images).topk(5, dim=1).indices
        hits = best5 == labels[:, None]
        top1 += int(hits[:, 0].sum())
        top5 += int(hits.any(dim=1).sum())
        seen += len(labels)
        bar.set_postfix(top1=f"{100 * top1 / seen:.2f}%", top5=f"{100 * top5 / seen:.2f}%")
    return {"images": seen, "top1": top1 / seen, "top5": top5 / seen}


def top_classes(logits: Tensor, k: int = 5) -> list[list[dict]]:
    """logits: (N, 1000) -> per image, the k most probable classes with their probabilities."""
    probabilities = logits.softmax(dim=1)
    values, indices = probabilities.topk(k, dim=1)
    names = class_names()
    return [
        [{"index": int(i), "wnid": names[int(i)][0], "name": names[int(i)][1], "probability": float(p)} for p, i in zip(row_p, row_i)]
        for row_p, row_i in zip(values, indices)
    ]


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--depth", type=int, choices=sorted(BLOCK_COUNTS), required=True, help="RedNet depth")
    parser.add_argument(
        "--weights", type=weights_argument, required=True, help=accepted_weights(command_line=True).removeprefix("expected ")
    )
    parser.add_argument("--compile", action="store_true", help="run the model under torch.compile")


def _load_model(parser: argparse.ArgumentParser, args: argparse.Namespace):
    from .download import DownloadError

    try:
        model = rednet(args.depth, weights=args.weights).eval()
    except (ValueError, DownloadError) as error:
        parser.error(str(error))
    return torch.compile(model) if args.compile else model


def evaluate_main(argv: list[str]) -> int:
    """``python -m oplib evaluate``: the top-1 and top-5 accuracy of a pretrained RedNet on an
    ImageNet-style folder (one subfolder of images per class, named by its WordNet ID, as
    ImageNet's validation set is usually laid out), with the paper's test preprocessing. Prints
    one JSON line. Needs the ``models`` extra (Pillow decodes the images).

        python -m oplib evaluate --depth 50 --weights paddleclas DATA_DIR
        python -m oplib evaluate --depth 26 --weights rednet26.pdparams --limit 1000 DATA_DIR
    """
    parser = cli_parser("python -m oplib evaluate", evaluate_main.__doc__)
    _model_arguments(parser)
    parser.add_argument("data", type=Path, help="folder with one subfolder of images per class (WordNet IDs)")
    parser.add_argument("--batch-size", type=int, default=50, help="images per forward (default 50)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="DataLoader worker processes")
    parser.add_argument("--limit", type=int, default=None, help="only the first N images (sorted by class, then name)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    require_extra(parser, "models")
    for name in ("batch_size", "limit"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    if args.workers < 0:
        parser.error(f"--workers: expected 0 or more, got {args.workers}")
    try:
        dataset = ImageFolder(args.data, args.limit)
    except ValueError as error:
        parser.error(str(error))
    model = _load_model(parser, args)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    start = time.perf_counter()
    result = evaluate(model, loader, progress=not args.quiet)
    result |= {"depth": args.depth, "weights": str(args.weights), "data": str(args.data), "seconds": round(time.perf_counter() - start, 2)}
    print(json.dumps(result))
    return 0


def predict_main(argv: list[str]) -> int:
    """``python -m oplib predict``: the five most probable ImageNet classes of each image, by a
    pretrained RedNet with the paper's test preprocessing. Needs the ``models`` extra (Pillow
    decodes the images).

        python -m oplib predict --depth 50 --weights paddleclas cat.jpg dog.png
        python -m oplib predict --depth 26 --weights paddleclas --json *.jpg
    """
    parser = cli_parser("python -m oplib predict", predict_main.__doc__)
    _model_arguments(parser)
    parser.add_argument("images", type=Path, nargs="+", help="image files (any format Pillow reads)")
    parser.add_argument("--json", action="store_true", help="one JSON line per image instead of a table")
    args = parser.parse_args(argv)
    require_extra(parser, "models")
    missing = [str(p) for p in args.images if not p.is_file()]
    if missing:
        parser.error(f"no such image: {', '.join(missing)}")
    model = _load_model(parser, args)
    with torch.no_grad():
        batch = torch.stack([preprocess(load_image(path)) for path in args.images])
        ranked = top_classes(model(batch))
    for path, classes in zip(args.images, ranked):
        if args.json:
            print(json.dumps({"image": str(path), "top5": classes}))
            continue
        print(path)
        for rank, c in enumerate(classes, 1):
            print(f"  {rank}. {100 * c['probability']:6.2f}%  {c['wnid']}  {c['name']}")
    return 0


__all__ = [
    "CROP",
    "ImageFolder",
    "MEAN",
    "RESIZE",
    "STD",
    "center_crop",
    "class_names",
    "evaluate",
    "load_image",
    "normalize",
    "preprocess",
    "resize_short_side",
    "top_classes",
]
