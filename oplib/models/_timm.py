"""The five RedNets in timm's model registry, for users who have timm: imported by
``oplib.models`` when timm imports, so that

    timm.create_model("rednet50", features_only=True, out_indices=(1, 2, 3, 4))
    timm.create_model("rednet50", pretrained=True, pretrained_cfg_overlay=dict(file="rednet50.pth"))

build oplib's models. The entry points build the model themselves (not through timm's
``build_model_with_cfg``): weights load through oplib's own loader
(``oplib.models.load_weights``: renamed keys, ``weights_only`` unpickling), and
``features_only`` gives oplib's ``RedNetFeatures``. timm's own arguments: ``in_chans`` is
``in_channels``; ``pretrained=True`` is ``weights=True`` (PaddleClas's ImageNet weights,
downloaded once), unless the pretrained cfg names a ``file`` or a ``state_dict``, which is then
the ``weights=`` value (a missing file is refused as ``weights=`` refuses it).

Untested in oplib's CI: no torchvision wheel on PyPI works with a CPU build of torch, and timm
imports torchvision (see the note in CHANGELOG.md).
"""

from __future__ import annotations

import dataclasses

from timm.models import PretrainedCfg, generate_default_cfgs, register_model, resolve_pretrained_cfg

from . import rednets as models

# register_model reads the module's default_cfgs when it decorates each entry point.
default_cfgs = generate_default_cfgs(
    {
        f"rednet{depth}": {k: v for k, v in cfg.items() if k in {f.name for f in dataclasses.fields(PretrainedCfg)}}
        for depth, cfg in models.PRETRAINED_CFGS.items()
    }
)
# timm's keyword arguments that oplib's builders take under their own names or not at all.
_TIMM_ONLY = ("cache_dir", "drop_rate", "drop_path_rate", "global_pool")


def _create(depth: int, pretrained: bool, pretrained_cfg=None, pretrained_cfg_overlay=None, **kwargs):
    for name in _TIMM_ONLY:
        value = kwargs.pop(name, None)
        if value not in (None, 0, 0.0, "avg"):
            raise ValueError(f"rednet{depth}: {name}={value!r} is not supported")
    if "in_chans" in kwargs:
        kwargs["in_channels"] = kwargs.pop("in_chans")
    weights = pretrained
    if pretrained:
        cfg = resolve_pretrained_cfg(f"rednet{depth}", pretrained_cfg, pretrained_cfg_overlay)
        # Without a file or state dict, timm's default source: the cfg's url, PaddleClas's file.
        weights = next((w for w in (cfg.state_dict, cfg.file) if w is not None), True)
    return models.rednet(depth, weights=weights, **kwargs)


def _entry_point(depth: int):
    def entry_point(pretrained: bool = False, **kwargs):
        return _create(depth, pretrained, **kwargs)

    # timm registers a model under its entry point's name.
    entry_point.__name__ = entry_point.__qualname__ = f"rednet{depth}"
    entry_point.__doc__ = f"RedNet-{depth} (oplib.models.rednet{depth}) for timm.create_model."
    return entry_point


for _depth in models.PRETRAINED_CFGS:
    globals()[f"rednet{_depth}"] = register_model(_entry_point(_depth))
