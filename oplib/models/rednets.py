"""RedNet (Li et al., CVPR 2021): ResNet-shaped backbones whose 3x3 convolutions are 7x7
involutions: oplib's ``Involution2d`` between torch.nn's convolutions, BatchNorms and linear head.

The architecture follows the paper's reference code (its mmcls ``RedNet`` with a
``GlobalAveragePooling`` neck and a linear head): the involution stem (3x3 conv stride 2 ->
3x3 involution -> BN -> ReLU -> 3x3 conv), a 3x3 max pool stride 2, four stages of
bottlenecks (1x1 conv -> 7x7 involution, stride on the involution -> 1x1 conv, expansion 4,
a 1x1 conv + BN shortcut where the shape changes), global average pooling and a linear
classifier. Initialisation as there: Kaiming normal (fan_out) for convolutions, BN weights 1
and the last BN of every bottleneck 0, the classifier N(0, 0.01).

The plain layers are torch.nn's, not ``oplib.nn.Conv2d``/``Linear`` (the same parameters, so
the same state dicts): under ``torch.compile`` with ``torch._inductor.config.freezing``,
inductor folds each BatchNorm into the convolution before it and the ReLU or residual add
after it into the convolution's kernel, which it cannot do through a custom op. The
involutions are oplib's op.

    input: (N, in_channels, H, W), any H, W >= 1 -> logits: (N, num_classes)

``rednet26(weights=...)`` and the other depths load weights: ``"paddleclas"`` (aliases
``"imagenet"`` and ``True``: the paper's ImageNet weights as PaddleClas serves them,
downloaded once into torch's hub cache), a PaddleClas ``.pdparams`` file, the paper's
released mmcls checkpoints (renamed by ``oplib.checkpoints.convert_official_state_dict``), an
oplib RedNet's ``state_dict()``, or ``None`` (random); ``oplib.checkpoints.resolve_weights``
decides what is accepted, for every entry point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import Tensor, nn

from .._compat import pooling_sizes_without_parity_guard
from ..checkpoints import PADDLECLAS, Weights, convert_official_state_dict, resolve_weights, state_dict_of
from ..nn import Involution2d, checkpoint_module

# The stem's max pool exports with a dynamic image size on every supported torch.
pooling_sizes_without_parity_guard()

BLOCK_COUNTS = {
    26: (1, 2, 4, 1),
    38: (2, 3, 5, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


# PaddleClas's copies of the paper's ImageNet weights (MODEL_URLS of PaddleClas's
# ppcls/arch/backbone/model_zoo/rednet.py): the copy still served; weights="paddleclas".
PADDLECLAS_URLS = {
    depth: f"https://paddle-imagenet-models-name.bj.bcebos.com/dygraph/RedNet{depth}_pretrained.pdparams"
    for depth in BLOCK_COUNTS
}
# The paper's own mmcls checkpoints, linked from its repository's README, whose links no
# longer resolve (d-li14/involution issues #54 and #62); a user who has a file loads its path.
PAPER_REPOSITORY = "https://github.com/d-li14/involution"


# What each depth's released ImageNet checkpoint expects and scored, in timm's pretrained_cfg
# keys (mean and std of 0-1 RGB; oplib.imagenet works on 0-255, the same values times 255).
# params_m, gflops, top1/top5: the paper's parameters (millions), multiply-adds at 224 px
# (billions) and its repository's accuracies; tests/models/test_backbones.py recounts the first two.
_PAPER_RESULTS = {
    26: dict(params_m=9.23, gflops=1.73, top1=75.96, top5=93.19),
    38: dict(params_m=12.39, gflops=2.22, top1=77.48, top5=93.57),
    50: dict(params_m=15.54, gflops=2.71, top1=78.35, top5=94.13),
    101: dict(params_m=25.65, gflops=4.74, top1=78.92, top5=94.35),
    152: dict(params_m=33.99, gflops=6.79, top1=79.12, top5=94.38),
}
PRETRAINED_CFGS = {
    depth: dict(
        architecture=f"rednet{depth}",
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=(7, 7),
        crop_pct=0.875,
        crop_mode="center",
        interpolation="bilinear",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        first_conv="stem.0.0",
        classifier="classifier",
        paper_ids="arXiv:2103.06255",
        license="apache-2.0",
        # timm's download field, and both sources: the numbers are the paper's for both (the
        # same weights; PaddleClas reports the paper's accuracies for its port).
        url=PADDLECLAS_URLS[depth],
        sources={
            "paddleclas": dict(url=PADDLECLAS_URLS[depth], weights="paddleclas", format="pdparams",
                               top1=results["top1"], top5=results["top5"]),
            "mmcls": dict(url=PAPER_REPOSITORY, weights="path of the downloaded .pth", format="mmcls checkpoint",
                          top1=results["top1"], top5=results["top5"], note="the repository's download links are dead"),
        },
        **results,
    )
    for depth, results in _PAPER_RESULTS.items()
}
# The feature levels: the stem's output (stride 2) and the four stages' (strides 4 to 32).
FEATURE_LEVELS = 5
# RedNets with at least this many bottlenecks (RedNet-50's 16) recompute their stem by default.
STEM_RECOMPUTED_FROM_BLOCKS = 16


def _conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class Bottleneck(nn.Module):
    """1x1 conv -> BN -> ReLU -> KxK involution (carrying the stride) -> BN -> ReLU -> 1x1 conv
    -> BN, plus the shortcut, -> ReLU. input: (N, in_channels, H, W) -> (N, out_channels, Ho, Wo)."""

    expansion = 4

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, kernel_size: int = 7, group_channels: int = 16):
        super().__init__()
        mid = out_channels // self.expansion
        self.reduce = _conv_bn_relu(in_channels, mid, 1)
        self.involution = Involution2d(mid, kernel_size, stride, group_channels=group_channels)
        self.involution_norm = nn.BatchNorm2d(mid)
        self.expand = nn.Conv2d(mid, out_channels, 1, bias=False)
        self.expand_norm = nn.BatchNorm2d(out_channels)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.involution_norm(self.involution(self.reduce(x))))
        out = self.expand_norm(self.expand(out))
        identity = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(out + identity)


def _take_indices(indices: Union[int, Sequence[int], None], name: str = "indices") -> list[int]:
    """Feature levels as timm counts them: None for all, an int n for the last n, or a sequence
    of levels (negative ones from the end)."""
    if indices is None:
        return list(range(FEATURE_LEVELS))
    if isinstance(indices, int):
        if not 0 < indices <= FEATURE_LEVELS:
            raise ValueError(f"RedNet: {name}={indices} asks for the last {indices} of {FEATURE_LEVELS} feature levels")
        return list(range(FEATURE_LEVELS - indices, FEATURE_LEVELS))
    levels = []
    for index in indices:
        if not -FEATURE_LEVELS <= index < FEATURE_LEVELS:
            raise ValueError(
                f"RedNet: {name} must lie in [0, {FEATURE_LEVELS}) (0: the stem, 1-4: the stages), got {list(indices)}"
            )
        levels.append(index % FEATURE_LEVELS)
    if not levels or sorted(set(levels)) != levels:
        raise ValueError(f"RedNet: {name} must be increasing, without repeats, got {list(indices)}")
    return levels


class FeatureInfo(list):
    """The feature levels a backbone returns, as timm's ``FeatureInfo``: a list of dicts
    (``num_chs``, ``reduction``, ``module``), with ``channels()``, ``reduction()`` and
    ``module_name()`` giving one value per level (or the level ``idx`` asks for)."""

    def _get(self, key: str, idx: Optional[int] = None):
        return [info[key] for info in self] if idx is None else self[idx][key]

    def channels(self, idx: Optional[int] = None):
        return self._get("num_chs", idx)

    def reduction(self, idx: Optional[int] = None):
        return self._get("reduction", idx)

    def module_name(self, idx: Optional[int] = None):
        return self._get("module", idx)


class _Backbone(nn.Module):
    """The stem, the max pool and the stages, with the fine-tuning knobs of the paper's
    detection and segmentation backbones (mmdet/mmseg configs): ``frozen_stages``,
    ``norm_eval`` and activation checkpointing. Subclasses set ``stem``, ``pool``, ``stages``."""

    stem: nn.Sequential
    pool: nn.MaxPool2d
    stages: nn.Sequential

    def _init_knobs(self, frozen_stages: int, norm_eval: bool) -> None:
        if not -1 <= frozen_stages <= len(self.stages):
            raise ValueError(
                f"RedNet: frozen_stages must lie in [-1, {len(self.stages)}] (-1: none, 0: the stem, k: the stem "
                f"and the first k stages), got {frozen_stages}"
            )
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.grad_checkpointing = False
        self.stem_checkpointing = False
        self._freeze()

    def _frozen_modules(self) -> list[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.stem, *list(self.stages)[: self.frozen_stages]]

    def _freeze(self) -> None:
        for module in self._frozen_modules():
            module.eval()
            for parameter in module.parameters():
                parameter.requires_grad_(False)

    def train(self, mode: bool = True):
        """As ``nn.Module.train``, but frozen stages stay in eval mode and, with ``norm_eval``,
        every BatchNorm does (its running statistics stay as loaded)."""
        super().train(mode)
        self._freeze()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each bottleneck's activations in the backward pass instead of saving them
        (``torch.utils.checkpoint``, non-reentrant; eager and torch.compile). BatchNorm running
        statistics are updated once per step, as without checkpointing."""
        self.grad_checkpointing = enable

    def set_generation_checkpointing(self, enable: bool = True) -> None:
        """Recompute each involution's kernel-generation branch (pooling, reduce conv,
        BatchNorm, ReLU) in the backward pass of a training step instead of saving its
        activations (``Involution2d.checkpoint_generation``): a lighter form of
        ``set_grad_checkpointing``, which recomputes whole bottlenecks. Not the default: it
        saves little next to the stem's recomputation and costs more of the step
        (bench/results/backbone.md). Running statistics are updated once per step."""
        for module in self.modules():
            if isinstance(module, Involution2d):
                module.checkpoint_generation = enable

    def set_stem_checkpointing(self, enable: bool = True) -> None:
        """Recompute the stem's activations and its max pool's in the backward pass of a
        training step instead of saving them (``False`` saves them): the stem works at half
        the input's resolution, where its maps are the largest of the network. The default
        from RedNet-50 up (16 bottlenecks or more), where a step then saves less than a
        ResNet-50's at a small share of its time; shallower RedNets pay a larger share and
        save them by default (bench/results/backbone.md). Running statistics are updated
        once per step; eval-mode calls never recompute."""
        self.stem_checkpointing = enable

    def _recomputes_stem(self) -> bool:
        return self.stem_checkpointing and self.training and torch.is_grad_enabled()

    def _stem(self, x: Tensor) -> Tensor:
        if self._recomputes_stem():
            return checkpoint_module(self.stem, self.stem, x)
        return self.stem(x)

    def _stem_and_pool(self, x: Tensor) -> Tensor:
        # Recomputed together, the pool's input and indices are not kept either: the first
        # block keeps the pooled map, a quarter of the stem's output.
        if self._recomputes_stem():
            return checkpoint_module(self.stem, lambda x: self.pool(self.stem(x)), x)
        return self.pool(self.stem(x))

    def _stage(self, index: int, x: Tensor) -> Tensor:
        stage = self.stages[index]
        if not (self.grad_checkpointing and torch.is_grad_enabled()):
            return stage(x)
        for block in stage:
            x = checkpoint_module(block, block, x)
        return x

    def _levels(self, x: Tensor, levels: Sequence[int], stop_early: bool = True) -> tuple[Tensor, list[Tensor]]:
        """The maps of ``levels`` (0: the stem's output, i: stage i's) and the last map computed."""
        wanted, last = set(levels), (max(levels) if stop_early and levels else len(self.stages))
        if 0 in wanted:
            x = self._stem(x)
            maps = [x]
            x = self.pool(x)
        else:
            x, maps = self._stem_and_pool(x), []
        for index in range(min(last, len(self.stages))):
            x = self._stage(index, x)
            if index + 1 in wanted:
                maps.append(x)
        return x, maps


class RedNet(_Backbone):
    """RedNet with ``block_counts`` bottlenecks in its four stages.

    width: the stem's output channels and the first stage's bottleneck width (64 in the
    paper); stage i has ``width * 2**i`` bottleneck channels and 4x that many outputs.
    group_channels: channels sharing one involution kernel (16 in the paper; narrow models
    need it to divide every involution's channels, the stem's width // 2 included).
    frozen_stages: -1 (none), 0 (the stem) or k (the stem and the first k stages): their
    parameters do not train and their BatchNorms stay in eval mode, across ``train()``.
    norm_eval: every BatchNorm stays in eval mode during training (fine-tuning with small
    batches, as the paper's detection and segmentation backbones do).

    input: (N, in_channels, H, W) -> logits (N, num_classes). ``forward_features`` gives the
    last stage's map (N, 32 * width, ceil(H / 32), ceil(W / 32)), ``forward_head`` pools it
    (``pre_logits=True``: the (N, 32 * width) vector) and classifies, ``forward_intermediates``
    gives the stem's and stages' maps; ``as_features`` or ``rednet50(features_only=True)``
    gives a backbone that returns them as a list.
    """

    def __init__(
        self,
        block_counts: Sequence[int],
        num_classes: int = 1000,
        in_channels: int = 3,
        width: int = 64,
        group_channels: int = 16,
        kernel_size: int = 7,
        frozen_stages: int = -1,
        norm_eval: bool = False,
    ):
        super().__init__()
        if len(block_counts) != 4 or min(block_counts) < 1:
            raise ValueError(f"RedNet: expected four positive block counts, got {list(block_counts)}")
        if width % 2 or (width // 2) % group_channels:
            raise ValueError(
                f"RedNet: the stem's involution has width // 2 = {width // 2} channels, which group_channels "
                f"({group_channels}) must divide"
            )
        self.block_counts = tuple(block_counts)
        self.stem = nn.Sequential(
            _conv_bn_relu(in_channels, width // 2, 3, stride=2),
            Involution2d(width // 2, 3, 1, group_channels=group_channels),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(inplace=True),
            _conv_bn_relu(width // 2, width, 3),
        )
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages, channels = [], width
        self.feature_info = FeatureInfo([dict(num_chs=width, reduction=2, module="stem")])
        for index, count in enumerate(block_counts):
            out_channels = width * 2**index * Bottleneck.expansion
            blocks = []
            for block in range(count):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(Bottleneck(channels, out_channels, stride, kernel_size, group_channels))
                channels = out_channels
            stages.append(nn.Sequential(*blocks))
            self.feature_info.append(dict(num_chs=out_channels, reduction=2 ** (index + 2), module=f"stages.{index}"))
        self.stages = nn.Sequential(*stages)
        self.num_features = self.features = channels
        self.num_classes = num_classes
        self.classifier = nn.Linear(channels, num_classes) if num_classes > 0 else nn.Identity()
        self.pretrained_cfg: dict = {}
        self.reset_parameters()
        self._init_knobs(frozen_stages, norm_eval)
        # The stem's half-resolution maps are the largest a step keeps. Recomputing them costs
        # about the stem's forward, a share of the step that falls with depth: within 5% from
        # RedNet-50 up (bench/results/backbone.md), 6-7% at 224 px for RedNet-26 and -38, which
        # save them by default.
        self.stem_checkpointing = sum(self.block_counts) >= STEM_RECOMPUTED_FROM_BLOCKS

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, Bottleneck):
                # Every residual branch starts as zero, so each block starts as its shortcut.
                nn.init.zeros_(module.expand_norm.weight)
        self._init_classifier()

    def _init_classifier(self) -> None:
        if isinstance(self.classifier, nn.Linear):
            nn.init.normal_(self.classifier.weight, std=0.01)
            nn.init.zeros_(self.classifier.bias)

    @property
    def default_cfg(self) -> dict:
        """timm's older name of ``pretrained_cfg``."""
        return self.pretrained_cfg

    def get_classifier(self) -> nn.Module:
        return self.classifier

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new, freshly initialised head of ``num_classes`` classes (0: none, ``forward``
        returns the pooled features). Only average pooling exists (``global_pool`` "avg")."""
        if global_pool not in (None, "avg"):
            raise ValueError(f"RedNet: only global_pool='avg' exists, got {global_pool!r}")
        self.num_classes = num_classes
        device = next(self.parameters()).device
        self.classifier = nn.Linear(self.num_features, num_classes, device=device) if num_classes > 0 else nn.Identity()
        self._init_classifier()

    def forward_features(self, x: Tensor) -> Tensor:
        """(N, in_channels, H, W) -> the last stage's map (N, self.num_features, H', W')."""
        return self._levels(x, [FEATURE_LEVELS - 1])[0]

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """The last stage's map -> logits (N, num_classes), or the pooled (N, self.num_features)."""
        x = x.mean(dim=(2, 3))
        return x if pre_logits else self.classifier(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Union[int, Sequence[int], None] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """The maps of the feature levels ``indices`` (0: the stem's, stride 2; 1-4: the
        stages', strides 4-32; an int n: the last n; None: all) as timm's models give them:
        ``(last stage's map, [maps])``, or the list alone with ``intermediates_only``.
        ``stop_early`` stops after the last level asked for (the first value is then that
        level's map). RedNet has no final norm (``norm`` is accepted and ignored) and only
        the NCHW format."""
        if output_fmt != "NCHW":
            raise ValueError(f"RedNet: only output_fmt='NCHW' exists, got {output_fmt!r}")
        levels = _take_indices(indices)
        last, maps = self._levels(x, levels, stop_early=stop_early or intermediates_only)
        return maps if intermediates_only else (last, maps)

    def prune_intermediate_layers(
        self, indices: Union[int, Sequence[int]] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stages after the last level of ``indices`` (and the head), as timm's
        feature wrappers ask; returns the levels kept."""
        levels = _take_indices(indices)
        self.stages = self.stages[: max(levels)]
        if prune_head:
            self.reset_classifier(0)
        return levels

    def as_features(self, out_indices: Union[int, Sequence[int]] = (1, 2, 3, 4)) -> "RedNetFeatures":
        """This model's stem and stages (shared, not copied) as a backbone returning the maps of
        ``out_indices``."""
        return RedNetFeatures(self, out_indices)


class RedNetFeatures(_Backbone):
    """A RedNet backbone: input (N, in_channels, H, W) -> the list of maps of ``out_indices``
    (0: the stem's (N, width, ceil(H / 2), ceil(W / 2)); stage i's ``(N, 2**(i + 1) * width,
    ceil(H / 2**(i + 1)), ceil(W / 2**(i + 1)))``). Holds only the modules those maps need (no
    head, no later stage: nothing without a gradient for DDP to complain about); its state
    dict keys are the classifier's. ``feature_info`` describes the maps it returns."""

    def __init__(self, model: RedNet, out_indices: Union[int, Sequence[int]] = (1, 2, 3, 4)):
        super().__init__()
        self.out_indices = tuple(_take_indices(out_indices, "out_indices"))
        self.stem, self.pool = model.stem, model.pool
        self.stages = model.stages[: max(self.out_indices)]
        self.feature_info = FeatureInfo(model.feature_info[level] for level in self.out_indices)
        self.pretrained_cfg = model.pretrained_cfg
        frozen = min(model.frozen_stages, len(self.stages))
        self._init_knobs(frozen, model.norm_eval)
        self.grad_checkpointing = model.grad_checkpointing
        self.stem_checkpointing = model.stem_checkpointing
        self.train(model.training)

    def forward(self, x: Tensor) -> list[Tensor]:
        return self._levels(x, self.out_indices)[1]


def _block_counts_of(state_dict) -> tuple[int, ...]:
    """The bottlenecks per stage that an oplib-named RedNet state dict holds."""
    counts = [0, 0, 0, 0]
    for key in state_dict:
        parts = key.split(".")
        if parts[0] == "stages" and len(parts) > 2 and parts[1].isdigit() and parts[2].isdigit() and int(parts[1]) < 4:
            counts[int(parts[1])] = max(counts[int(parts[1])], int(parts[2]) + 1)
    return tuple(counts)


def _first(keys, count: int = 3) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:count])
    return shown + (f" and {len(keys) - count} more" if len(keys) > count else "")


# What weights= takes: the values oplib.checkpoints.resolve_weights accepts.
WeightsValue = Union[Weights, bool, None]


def _weights_source(weights: WeightsValue, block_counts: Sequence[int], name: str) -> Optional[Weights]:
    """``weights`` resolved, the named source downloaded for the depth of ``block_counts``."""
    source = resolve_weights(weights)
    if not isinstance(source, str):  # paths resolve to Path: a str is the named source, PADDLECLAS
        return source
    depth = next((d for d, counts in BLOCK_COUNTS.items() if counts == tuple(block_counts)), None)
    if depth is None:
        raise ValueError(
            f"{name}: weights={weights!r}: PaddleClas publishes weights for the paper's depths "
            f"{sorted(BLOCK_COUNTS)}, not for block counts {list(block_counts)}"
        )
    from ..download import cached_download

    return cached_download(PADDLECLAS_URLS[depth])


def load_weights(model: RedNet, weights: WeightsValue, name: str = "RedNet") -> RedNet:
    """Load ``weights`` into ``model``, strictly: every backbone tensor must be there with its
    shape, and nothing else. ``weights``: any value ``oplib.checkpoints.resolve_weights``
    accepts (``None``: nothing is loaded; ``"paddleclas"``: the file for the model's depth,
    downloaded once; a path or a loaded dict, read by ``oplib.checkpoints.state_dict_of``).
    The classifier is loaded when the checkpoint has one of the model's size; a checkpoint
    without a head (a backbone-only one) or with another number of classes loads only into a
    model built with ``num_classes`` other than 1000, whose new head keeps its initialisation."""
    source = _weights_source(weights, model.block_counts, name)
    if source is None:
        return model
    state_dict = state_dict_of(source)
    if not isinstance(model.classifier, nn.Linear):  # no head (num_classes=0): a checkpoint's is not needed
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("classifier.")}
    expected = model.state_dict()
    head = {key for key in expected if key.startswith("classifier.")}
    missing, unexpected = set(expected) - head - set(state_dict), set(state_dict) - set(expected)
    if missing or unexpected:
        message = f"{name}: the checkpoint does not fit this model"
        if missing:
            message += f"; missing: {_first(missing)}"
        if unexpected:
            message += f"; unexpected: {_first(unexpected)}"
        fits = [depth for depth, counts in BLOCK_COUNTS.items() if counts == _block_counts_of(state_dict)]
        if fits:
            message += f"; its keys fit RedNet-{fits[0]}"
        raise ValueError(message)
    head_fits = all(key in state_dict and state_dict[key].shape == expected[key].shape for key in head)
    if not head_fits:
        if model.num_classes == 1000:
            found = state_dict.get("classifier.weight")
            what = "no classifier" if found is None else f"a classifier of {found.shape[0]} classes"
            raise ValueError(
                f"{name}: the checkpoint has {what}; build the model with num_classes=N (N != 1000) to load "
                "its backbone under a new, freshly initialised head"
            )
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("classifier.")}
    try:
        model.load_state_dict(state_dict, strict=head_fits)
    except RuntimeError as error:  # shapes: another width, or another number of input channels
        raise ValueError(f"{name}: {error}") from None
    return model


def _rednet(depth: int, weights: WeightsValue, kwargs) -> Union[RedNet, RedNetFeatures]:
    resolve_weights(weights)  # a bad value is refused before a model is built
    features_only = kwargs.pop("features_only", False)
    if features_only:
        out_indices = kwargs.pop("out_indices", (1, 2, 3, 4))
        kwargs.setdefault("num_classes", 0)
    model = RedNet(BLOCK_COUNTS[depth], **kwargs)
    model.pretrained_cfg = dict(PRETRAINED_CFGS[depth])
    load_weights(model, weights, f"RedNet-{depth}")
    return model.as_features(out_indices) if features_only else model


def rednet26(weights: WeightsValue = None, **kwargs) -> RedNet:
    """RedNet-26: block counts (1, 2, 4, 1). ``weights``: ``None`` or ``False`` (random
    initialisation), ``"paddleclas"``, ``"imagenet"`` or ``True`` (PaddleClas's ImageNet
    weights, downloaded once into ``torch.hub.get_dir()/checkpoints``), the path of a
    ``.pdparams``, mmcls or oplib checkpoint file, or a loaded dict
    (``oplib.checkpoints.resolve_weights``; anything else raises, listing these);
    ``features_only=True`` (with ``out_indices``, default (1, 2, 3, 4)) gives a
    ``RedNetFeatures`` backbone; other keyword arguments go to ``RedNet`` (``num_classes``,
    ``frozen_stages``, ``norm_eval``, ...)."""
    return _rednet(26, weights, kwargs)


def rednet38(weights: WeightsValue = None, **kwargs) -> RedNet:
    """RedNet-38: block counts (2, 3, 5, 2). Arguments as ``rednet26``."""
    return _rednet(38, weights, kwargs)


def rednet50(weights: WeightsValue = None, **kwargs) -> RedNet:
    """RedNet-50: block counts (3, 4, 6, 3). Arguments as ``rednet26``."""
    return _rednet(50, weights, kwargs)


def rednet101(weights: WeightsValue = None, **kwargs) -> RedNet:
    """RedNet-101: block counts (3, 4, 23, 3). Arguments as ``rednet26``."""
    return _rednet(101, weights, kwargs)


def rednet152(weights: WeightsValue = None, **kwargs) -> RedNet:
    """RedNet-152: block counts (3, 8, 36, 3). Arguments as ``rednet26``."""
    return _rednet(152, weights, kwargs)


def rednet(depth: int, weights: WeightsValue = None, **kwargs) -> RedNet:
    """The RedNet of ``depth`` (26, 38, 50, 101 or 152); arguments as ``rednet26``."""
    if depth not in BLOCK_COUNTS:
        raise ValueError(f"RedNet: expected a depth in {sorted(BLOCK_COUNTS)}, got {depth}")
    return _rednet(depth, weights, kwargs)


__all__ = [
    "BLOCK_COUNTS",
    "Bottleneck",
    "FEATURE_LEVELS",
    "FeatureInfo",
    "PADDLECLAS",
    "PADDLECLAS_URLS",
    "PRETRAINED_CFGS",
    "RedNet",
    "RedNetFeatures",
    "convert_official_state_dict",
    "load_weights",
    "rednet",
    "rednet26",
    "rednet38",
    "rednet50",
    "rednet101",
    "rednet152",
]
