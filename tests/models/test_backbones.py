"""RedNet as a backbone: feature maps, the fine-tuning knobs (frozen stages, norm_eval,
activation checkpointing, a new head) and the pretrained configuration, on narrow models
(width 16, 8 channels a group) so that every depth runs in seconds."""

from __future__ import annotations

import copy
import math
import re
import types
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import oplib.models
import oplib.nn
from oplib.models import rednets
from oplib import imagenet
from oplib.download import DownloadError
from oplib.models import BLOCK_COUNTS, FEATURE_LEVELS, PRETRAINED_CFGS, RedNet, RedNetFeatures

MODELS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _narrow(depth: int = 26, **kwargs) -> RedNet:
    torch.manual_seed(0)
    kwargs.setdefault("num_classes", 10)
    return oplib.models.rednet(depth, width=16, group_channels=8, **kwargs)


def _with_statistics(model: nn.Module) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters (a fresh model's are 0 and 1)."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            for tensor in (module.running_mean, module.bias):
                tensor.data.copy_(torch.randn(tensor.shape, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
            # Small scales: involution's kernels are generated from its input, so activations
            # grow quadratically through the blocks with scales near 1.
            module.weight.data.copy_(torch.rand(module.weight.shape, generator=generator) * 0.2 + 0.1)
    return model


def _old_forward(model: RedNet, x: torch.Tensor) -> torch.Tensor:
    """The classifier's computation before the backbone API, written out."""
    return model.classifier(model.stages(model.pool(model.stem(x))).mean(dim=(2, 3)))


def test_logits_are_unchanged_by_the_backbone_api():
    model = _with_statistics(_narrow(50)).eval()
    x = torch.randn(2, 3, 45, 38)
    with torch.no_grad():
        expected = _old_forward(model, x)
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(model.forward_head(model.forward_features(x)), expected, rtol=0, atol=0)
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    assert pooled.shape == (2, model.num_features)


@pytest.mark.parametrize("depth", sorted(BLOCK_COUNTS))
def test_feature_maps_at_an_odd_size_at_every_depth(depth):
    """225 px: every stride-2 layer rounds up, as torch's padded convolutions do."""
    backbone = _narrow(depth, features_only=True, out_indices=(0, 1, 2, 3, 4)).eval()
    with torch.no_grad():
        maps = backbone(torch.randn(1, 3, 225, 225))
    assert [tuple(m.shape[1:]) for m in maps] == [
        (channels, math.ceil(225 / reduction), math.ceil(225 / reduction))
        for channels, reduction in zip(backbone.feature_info.channels(), backbone.feature_info.reduction())
    ]
    assert backbone.feature_info.reduction() == [2, 4, 8, 16, 32]
    assert backbone.feature_info.channels() == [16, 64, 128, 256, 512]


def test_forward_intermediates_follows_timm():
    model = _with_statistics(_narrow(26)).eval()
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        last, maps = model.forward_intermediates(x)
        assert len(maps) == FEATURE_LEVELS
        torch.testing.assert_close(last, model.forward_features(x), rtol=0, atol=0)
        torch.testing.assert_close(maps[-1], last, rtol=0, atol=0)
        # An int: the last n levels; negative levels count from the end; intermediates_only
        # (and stop_early) stop after the last level asked for.
        for indices, levels in [(2, [3, 4]), ([0, -1], [0, 4]), ([1, 2], [1, 2])]:
            only = model.forward_intermediates(x, indices=indices, intermediates_only=True)
            assert len(only) == len(levels)
            for got, level in zip(only, levels):
                torch.testing.assert_close(got, maps[level], rtol=0, atol=0)
        early_last, early = model.forward_intermediates(x, indices=[1], stop_early=True)
        torch.testing.assert_close(early_last, maps[1], rtol=0, atol=0)
    for bad in ([5], [2, 1], [1, 1], 0, 6, []):
        with pytest.raises(ValueError, match="RedNet"):
            model.forward_intermediates(x, indices=bad)
    with pytest.raises(ValueError, match="NCHW"):
        model.forward_intermediates(x, output_fmt="NHWC")


def test_features_only_holds_what_its_maps_need_and_shares_the_state_dict_names():
    model = _with_statistics(_narrow(26)).eval()
    backbone = model.as_features(out_indices=(1, 2))
    assert len(backbone.stages) == 2 and not hasattr(backbone, "classifier")
    assert set(backbone.state_dict()) < set(model.state_dict())
    x = torch.randn(2, 3, 37, 41)
    with torch.no_grad():
        _, maps = model.forward_intermediates(x, indices=[1, 2])
        for got, expected in zip(backbone(x), maps):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # Every parameter gets a gradient (DDP's find_unused_parameters=False would raise otherwise).
    backbone.train()
    sum(m.square().mean() for m in backbone(x)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in backbone.parameters())


def test_features_only_loads_a_classifier_checkpoint(tmp_path):
    model = _with_statistics(_narrow(50, num_classes=1000)).eval()
    path = tmp_path / "rednet50.pth"
    torch.save(model.state_dict(), path)
    backbone = oplib.models.rednet50(weights=path, width=16, group_channels=8, features_only=True).eval()
    assert isinstance(backbone, RedNetFeatures) and backbone.out_indices == (1, 2, 3, 4)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for got, expected in zip(backbone(x), model.forward_intermediates(x, indices=[1, 2, 3, 4])[1]):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert backbone.pretrained_cfg["top1"] == PRETRAINED_CFGS[50]["top1"]


def _train_step(model: nn.Module, x: torch.Tensor) -> None:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    out = model(x)
    loss = sum(o.square().mean() for o in out) if isinstance(out, list) else out.square().mean()
    loss.backward()
    optimizer.step()


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("features_only", [False, True])
def test_frozen_stages_do_not_change_across_train_and_a_step(features_only):
    model = _with_statistics(_narrow(26, frozen_stages=2, features_only=features_only))
    model.train()  # must not unfreeze
    frozen = [model.stem, model.stages[0], model.stages[1]]
    assert not any(m.training for m in frozen) and model.stages[2].training
    assert not any(p.requires_grad for m in frozen for p in m.parameters())
    before = [_snapshot(m) for m in frozen], _snapshot(model.stages[2])
    _train_step(model, torch.randn(4, 3, 32, 32))
    for module, saved in zip(frozen, before[0]):
        for key, value in module.state_dict().items():
            torch.testing.assert_close(value, saved[key], rtol=0, atol=0, msg=key)
    changed = [k for k, v in model.stages[2].state_dict().items() if not torch.equal(v, before[1][k])]
    assert any(k.endswith("running_mean") for k in changed) and any(k.endswith("weight") for k in changed)
    with pytest.raises(ValueError, match="frozen_stages"):
        _narrow(26, frozen_stages=5)


def test_norm_eval_keeps_every_batchnorm_in_eval_mode():
    model = _with_statistics(_narrow(26, norm_eval=True))
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    statistics = [(m.running_mean.clone(), m.running_var.clone()) for m in norms]
    weights = [m.weight.detach().clone() for m in norms]
    _train_step(model, torch.randn(4, 3, 32, 32))
    assert model.training and not any(m.training for m in norms)
    for norm, (mean, var) in zip(norms, statistics):
        assert torch.equal(norm.running_mean, mean) and torch.equal(norm.running_var, var)
    # The BatchNorms' own parameters still train (as in the paper's backbones).
    assert any(not torch.equal(norm.weight, before) for norm, before in zip(norms, weights))


def test_reset_classifier():
    model = _with_statistics(_narrow(26)).eval()
    x = torch.randn(2, 3, 32, 32)
    model.reset_classifier(7)
    assert model(x).shape == (2, 7) and model.get_classifier().out_features == 7
    model.reset_classifier(0)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x), pre_logits=True))
    with pytest.raises(ValueError, match="avg"):
        model.reset_classifier(3, global_pool="max")


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for the backward pass (each storage once)."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(storages.values())


def test_the_stem_is_recomputed_by_default_from_rednet50_up_and_only_in_training(monkeypatch):
    """RedNet-50 and deeper recompute the stem by default, RedNet-26 and -38 save it (the
    generation branches on request): a training step saves less than with nothing
    recomputed, less again with the generation branches, and evaluation, with or without
    grad, recomputes nothing."""
    defaults = {depth: oplib.models.rednet(depth, width=16, group_channels=8).stem_checkpointing for depth in BLOCK_COUNTS}
    assert defaults == {26: False, 38: False, 50: True, 101: True, 152: True}
    model = _narrow(50)
    involutions = [m for m in model.modules() if isinstance(m, oplib.nn.Involution2d)]
    assert model.stem_checkpointing and involutions and not any(m.checkpoint_generation for m in involutions)
    assert model.as_features().stem_checkpointing and not _narrow(26).as_features().stem_checkpointing
    x = torch.randn(2, 3, 32, 32)
    default = _saved_bytes(model.train(), x)
    model.set_stem_checkpointing(False)
    assert _saved_bytes(model, x) > default
    model.set_stem_checkpointing(True)
    model.set_generation_checkpointing(True)
    assert _saved_bytes(model, x) < default
    calls = []
    for module in (oplib.nn, rednets):
        original = module.checkpoint_module
        monkeypatch.setattr(module, "checkpoint_module", lambda *a, f=original: calls.append(1) or f(*a))
    model.train()(x).sum().backward()
    assert calls, "a training step recomputed nothing"
    calls.clear()
    model.eval()(x).sum().backward()
    assert not calls, "an eval-mode call recomputed"


@pytest.mark.parametrize("method,fraction", [("set_grad_checkpointing", 0.5), ("set_generation_checkpointing", 1.0),
                                             ("set_stem_checkpointing", 1.0)])
def test_checkpointing_gives_the_same_step_and_saves_less(method, fraction):
    plain = _with_statistics(_narrow(50)).double().train()
    plain.set_stem_checkpointing(False)
    checkpointed = copy.deepcopy(plain)
    getattr(checkpointed, method)(True)
    x = torch.randn(2, 3, 48, 48, dtype=torch.float64)
    for model in (plain, checkpointed):
        model(x).square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=name)
    # The recomputation normalises with the batch but leaves the running statistics alone.
    for (name, a), b in zip(plain.named_buffers(), checkpointed.buffers()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert _saved_bytes(checkpointed, x) < fraction * _saved_bytes(plain, x)
    with torch.no_grad():  # no recomputation to arrange without autograd
        torch.testing.assert_close(checkpointed(x), plain(x), rtol=0, atol=0)


def test_stem_checkpointing_recomputes_the_max_pool_unless_the_stem_map_is_asked_for():
    """The stem and its max pool are recomputed together: a step keeps neither the pool's
    input nor its indices (no map at the stem's size); asked for the stem's map (level 0),
    the pool runs outside the recomputation. Both give the plain model's gradients."""
    plain = _with_statistics(_narrow(26)).double().train()
    plain.set_stem_checkpointing(False)
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_stem_checkpointing(True)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    stem_size = (16, 16)
    for levels in ([4], [0, 4]):
        grads = []
        for model in (plain, checkpointed):
            shapes = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
                last, maps = model.forward_intermediates(x, indices=levels)
            (last.square().sum() + sum(m.sum() for m in maps)).backward()
            grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
            model.zero_grad()
            at_stem_size = [shape for shape in shapes if shape[2:] == stem_size]
            if model is checkpointed and levels == [4]:
                assert not at_stem_size, shapes
            elif model is checkpointed:
                assert 0 < len(at_stem_size) < 4, shapes  # the pool's input and indices only
        for (name, _), want, got in zip(plain.named_parameters(), *grads):
            if name.startswith("classifier"):  # not in forward_intermediates
                assert want is None and got is None
                continue
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=name)


def test_checkpointed_stem_traces_without_message_functions_in_its_graph():
    """Dynamo keeps a torch._check call inside a checkpointed region in the graph, with its
    message function, which inductor's FX cache cannot pickle ("Failed to pickle cache key":
    no cache, a full compile in every process). Involution2d's size check with a static
    size is not called at all."""
    model = _narrow(26).train()
    model.set_stem_checkpointing(True)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compiler.reset()
    torch.compile(model, backend=capture, fullgraph=True)(torch.randn(2, 3, 32, 32))
    modules = [module for gm in graphs for module in gm.modules() if isinstance(module, torch.fx.GraphModule)]
    assert any("checkpoint" in str(node.target) for gm in modules for node in gm.graph.nodes)
    functions = [(node.target, getattr(gm, node.target)) for gm in modules for node in gm.graph.nodes
                 if node.op == "get_attr" and isinstance(getattr(gm, node.target), types.FunctionType)]
    assert not functions, functions


# The blocks' checkpointing in the unit tier, the stem's (the same checkpoint call around other
# modules) in the integration tier.
@pytest.mark.parametrize("method", ["set_grad_checkpointing",
                                    pytest.param("set_stem_checkpointing", marks=pytest.mark.integration)])
def test_checkpointing_under_torch_compile_matches_eager(method):
    """aot_eager: dynamo and AOTAutograd trace the checkpointed blocks or stem (inductor's part
    is the integration tier's compiled training)."""
    plain = _with_statistics(_narrow(26)).train()
    plain.set_stem_checkpointing(False)
    checkpointed = copy.deepcopy(plain)
    getattr(checkpointed, method)(True)
    compiled = torch.compile(checkpointed, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 32, 32)
    out, expected = compiled(x), plain(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, a), b in zip(plain.named_buffers(), checkpointed.buffers()):
        torch.testing.assert_close(b, a, msg=name)


@pytest.mark.parametrize("depth", sorted(BLOCK_COUNTS))
def test_pretrained_cfg_counts_match_the_model(depth):
    """The paper's parameter count exactly (to its two decimals); its multiply-adds within 3%
    above torch's FLOP counter's (which counts convolutions, matrix products and involutions;
    the paper's counter presumably also counts the BatchNorms, activations and pooling)."""
    cfg = PRETRAINED_CFGS[depth]
    model = oplib.models.rednet(depth).eval()
    assert model.pretrained_cfg == cfg and cfg["architecture"] == f"rednet{depth}"
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - cfg["params_m"]) < 0.006
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, *cfg["input_size"]))
    counted = counter.get_total_flops() / 2e9
    assert 1.0 < cfg["gflops"] / counted < 1.03, (cfg["gflops"], counted)


def test_imagenet_preprocessing_comes_from_the_pretrained_cfg():
    assert (imagenet.RESIZE, imagenet.CROP) == (256, 224)
    assert imagenet.MEAN == (123.675, 116.28, 103.53) and imagenet.STD == (58.395, 57.12, 57.375)
    assert all(imagenet.settings(cfg) == imagenet.settings(PRETRAINED_CFGS[50]) for cfg in PRETRAINED_CFGS.values())


def test_docs_accuracy_table_is_the_pretrained_cfg():
    rows = re.findall(r"^\| RedNet-(\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", MODELS_PAGE.read_text(), re.M)
    assert sorted(int(r[0]) for r in rows) == sorted(PRETRAINED_CFGS)
    for depth, params, gflops, top1, top5 in rows:
        cfg = PRETRAINED_CFGS[int(depth)]
        assert (float(params), float(gflops), float(top1), float(top5)) == (cfg["params_m"], cfg["gflops"], cfg["top1"], cfg["top5"])


def test_timm_creates_oplib_rednets(tmp_path, monkeypatch):
    """Runs where timm imports (not in oplib's CI: timm needs torchvision, which has no CPU
    build on PyPI to go with the pinned CPU torch)."""
    timm = pytest.importorskip("timm", exc_type=ImportError)
    assert timm.list_models("rednet*") == ["rednet26", "rednet38", "rednet50", "rednet101", "rednet152"]
    backbone = timm.create_model("rednet26", features_only=True, out_indices=(1, 2), width=16, group_channels=8)
    assert isinstance(backbone, RedNetFeatures) and backbone.feature_info.channels() == [64, 128]
    reference = _with_statistics(_narrow(26, num_classes=1000)).eval()
    torch.save(reference.state_dict(), tmp_path / "rednet26.pth")
    model = timm.create_model(
        "rednet26", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "rednet26.pth")), width=16, group_channels=8
    ).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    # Without a file: PaddleClas's, downloaded (here from a port where nothing listens).
    monkeypatch.setitem(oplib.models.PADDLECLAS_URLS, 26, "http://127.0.0.1:9/RedNet26_pretrained.pdparams")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    with pytest.raises(DownloadError, match=r"cannot reach http://127.0.0.1:9/RedNet26_pretrained.pdparams .*by hand"):
        timm.create_model("rednet26", pretrained=True)
