"""The perception network's architectures (seed 000, section III) and the run-time device options."""

import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

from leaklab.attacks.rl.config import RoomReconstruction
from leaklab.device import processor, repeatable, require_device
from leaklab.errors import LeaklabError
from leaklab.experiments import room_attack, room_tables
from leaklab.models.perception import (ARCH_NAMES, PerceptionNet, PerceptionSpec, build_perception_net,
                                       check_contract, conv_feature_count, plain_conv)
from leaklab.names import DEFAULT_ARCH


def _images(setting, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(2, PerceptionSpec(setting=setting).in_channels, 150, 150, generator=g)


def test_s2_small_is_the_stacked_network():
    a = build_perception_net(PerceptionSpec(setting="S2", arch="small"), seed=3)
    b = build_perception_net(PerceptionSpec(setting="S2", arch="stacked"), seed=3)
    x, box = _images("S2"), torch.rand(2, 4)
    assert torch.equal(a(x, box), b(x, box))


def test_wide_rgb_widens_the_rgb_stream_alone():
    """``wide-rgb``: S2 is ``small`` to the weight (and the digest); in S1 the RGB stream is 64 wide."""
    from leaklab.models.perception import WIDE_RGB_WIDTHS, architecture_digest

    a = build_perception_net(PerceptionSpec(setting="S2", arch="small"), seed=3).state_dict()
    b = build_perception_net(PerceptionSpec(setting="S2", arch="wide-rgb"), seed=3).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert architecture_digest(PerceptionSpec(setting="S2", arch="wide-rgb")) == architecture_digest(
        PerceptionSpec(setting="S2"))
    s1 = build_perception_net(PerceptionSpec(setting="S1", arch="wide-rgb"), seed=3)
    assert [s1.conv.rgb[i].out_channels for i in (0, 2, 4)] == list(WIDE_RGB_WIDTHS)
    assert [s1.conv.depth[i].out_channels for i in (0, 2, 4)] == [16, 32, 32]


@pytest.mark.parametrize("arch", ["small", "wide-rgb", "deep"])
def test_s1_streams_see_one_modality_each(arch):
    s1 = build_perception_net(PerceptionSpec(setting="S1", arch=arch), seed=5)
    s2 = build_perception_net(PerceptionSpec(setting="S2", arch=arch), seed=5)
    x = _images("S1")
    f = s1.conv(x)
    depth_part = f[:, -s2.conv_features:]
    # the depth stream is built first: the same weights as the S2 network of the same seed
    assert torch.equal(depth_part, s2.conv(x[:, 3:]))
    changed = x.clone()
    changed[:, :3] = torch.rand_like(changed[:, :3])
    g = s1.conv(changed)
    assert torch.equal(g[:, -s2.conv_features:], depth_part)
    assert not torch.equal(g[:, :-s2.conv_features], f[:, :-s2.conv_features])


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("setting", ["S1", "S2"])
def test_feature_count_matches_the_conv_output(setting, arch):
    net = build_perception_net(PerceptionSpec(setting=setting, arch=arch), seed=0)
    assert net.conv(_images(setting)[:1]).shape[1] == conv_feature_count(net) == net.conv_features


@pytest.mark.parametrize("conv, plain", [
    (nn.Conv2d(2, 3, 4, stride=2), True), (nn.Conv2d(2, 3, 3, padding=1), False),
    (nn.Conv2d(2, 3, 3, dilation=2), False), (nn.Conv2d(2, 4, 3, groups=2), False), (nn.Linear(2, 3), False)])
def test_a_plain_conv_reads_one_block_per_output(conv, plain):
    assert plain_conv(conv) is plain
    if isinstance(conv, nn.Conv2d):  # output (1, 1): the input block at (stride, stride) alone, every channel
        x = torch.randn(1, 2, 12, 12)
        (kh, kw), (sh, sw) = conv.kernel_size, conv.stride
        block = torch.zeros_like(x)
        block[..., sh:sh + kh, sw:sw + kw] = x[..., sh:sh + kh, sw:sw + kw]
        one_channel = x.clone()
        one_channel[:, -1] = 0
        with torch.no_grad():
            out = conv(x)[0, 0, 1, 1]
            reads_block = torch.allclose(out, conv(block)[0, 0, 1, 1], atol=1e-6)
            reads_all_channels = not torch.allclose(out, conv(one_channel)[0, 0, 1, 1], atol=1e-6)
        assert (reads_block and reads_all_channels) is plain


def test_contract_accepts_any_conv_module_and_refuses_a_missing_head():
    net = build_perception_net(PerceptionSpec(setting="S1"), seed=0)
    assert not isinstance(net.conv, nn.Sequential)
    assert check_contract(net, "small") is net
    del net.head
    with pytest.raises(LeaklabError, match="contract"):
        check_contract(net, "headless")


def test_a_users_class_is_checked_with_the_weights_it_is_given():
    """A trained scale on the output passed the check on the fresh network (scale 1); with the case's weights
    (scale 3) the attacks' Q-values came out 67% off, silently."""
    from leaklab.threat import model_with_state

    spec, cls = PerceptionSpec(setting="S2"), "tests.plugins.narrow_net:OutScale"
    state = build_perception_net(spec, seed=0, model_class=cls).state_dict()
    assert model_with_state(spec, state, cls) is not None
    with pytest.raises(LeaklabError, match=r"with the case's weights: the output is not head\(cat"):
        model_with_state(spec, {**state, "scale": torch.tensor(3.0)}, cls)
    # leaklab's Normalize inside a user's class is the class's own (an AttributeError's traceback for a while)
    normalized = "tests.plugins.narrow_net:Normalized"
    assert model_with_state(spec, build_perception_net(spec, seed=0, model_class=normalized).state_dict(), normalized)


def test_device_option_is_checked(monkeypatch):
    from leaklab.device import default_device

    monkeypatch.setenv("LEAKLAB_DEVICE", "bogus")  # torch's RuntimeError, a traceback
    with pytest.raises(LeaklabError, match="LEAKLAB_DEVICE 'bogus': choose cpu or cuda"):
        default_device()
    monkeypatch.setenv("LEAKLAB_DEVICE", "cpu")
    assert default_device() == torch.device("cpu")
    from leaklab import device

    checks = []  # once a process: a CUDA name's check starts a child process, which every attack paid
    monkeypatch.setattr(device, "require_device", lambda name, what: checks.append(name))
    monkeypatch.setattr(device, "_ENV_DEVICES_CHECKED", set())
    assert [default_device() for _ in range(3)] == [torch.device("cpu")] * 3 and checks == ["cpu"]
    with pytest.raises(ValueError, match="device"):
        room_attack.RoomRunConfig(device="gpu")
    assert room_attack.RoomRunConfig(device="cuda:1").device == "cuda:1"
    if not torch.cuda.is_available():
        with pytest.raises(LeaklabError, match="no CUDA GPU"):
            require_device("cuda")
    require_device("cpu")


def test_a_cuda_device_is_checked_without_initialising_cuda(monkeypatch):
    """The room audit's parent checks --device and then starts ViZDoom's engines by fork: the check counts
    the GPUs (NVML) and leaves the CUDA runtime alone."""
    def initialise():
        raise AssertionError("the CUDA runtime was initialised")

    from leaklab import device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(device, "_cuda_works", lambda: True)  # (asked of a child process)
    monkeypatch.setattr(torch.cuda, "is_available", initialise)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", initialise, raising=False)
    monkeypatch.setattr(torch.cuda, "init", initialise)
    for name in ("cuda", "cuda:0", "cuda:1"):
        require_device(name)
    with pytest.raises(LeaklabError, match=r"--device cuda:2: this process sees 2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        require_device("cuda:2")
    monkeypatch.setattr(device, "_cuda_works", lambda: False)  # NVML counts a GPU that CUDA cannot use
    with pytest.raises(LeaklabError, match="no CUDA GPU is available"):
        require_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(LeaklabError, match="no CUDA GPU is available"):
        require_device("cuda:0")


def test_the_child_process_cuda_probe_agrees_with_torch_here():
    from leaklab import device

    assert device._cuda_works() == torch.cuda.is_available()


def test_results_name_the_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    first = ("processor\t: 0\nmodel name\t: Some CPU\ncpu family\t: 6\nmodel\t\t: 143\n"
             "flags\t\t: fpu avx2 avx512f amx_tile\n")
    info.write_text(first + "\nprocessor\t: 1\nmodel name\t: Other CPU\nflags\t\t: avx2\n")
    assert processor(info) == "Some CPU (family 6 model 143, amx)"
    info.write_text("model name\t: Old CPU\nflags\t\t: sse2\n")
    assert processor(info) == "Old CPU"
    assert processor(tmp_path / "missing")  # no /proc/cpuinfo: the platform's name, or 'unknown'


def test_cuda_attacks_run_deterministic_in_float32_and_restore_the_settings(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so the test's own setting is undone
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert not torch.are_deterministic_algorithms_enabled()
    with repeatable("cpu"):  # the CPU's single-threaded kernels repeat already: nothing to change
        assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    torch.backends.cudnn.benchmark = True
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with repeatable("cuda:0"):  # only flags are set: no GPU needed to check them
                assert torch.are_deterministic_algorithms_enabled()
                assert not torch.backends.cudnn.benchmark
                assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
                assert torch.backends.cudnn.conv.fp32_precision == "ieee"  # not TF32
                raise RuntimeError("inside")
        assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"  # torch's default, back
    finally:
        torch.backends.cudnn.benchmark = False


def test_reconstruction_moves_every_tensor():
    rec = RoomReconstruction(images=torch.zeros(1, 1, 4, 4, dtype=torch.float64), box=torch.zeros(1, 4),
                             action=torch.zeros(1, dtype=torch.long), iterations=1, seconds=0.0,
                             reward=torch.ones(1), exact=("box",))
    moved = rec.to("cpu")
    assert moved.images.dtype == torch.float64 and moved.reward is not None and moved.q_pred is None
    assert moved.exact == ("box",) and moved.iterations == 1


def test_unknown_table_cells_are_refused(tmp_path):
    with pytest.raises(LeaklabError, match="--cells"):
        room_tables.table1(tmp_path, mode="exact", samples=1, cells=("qgi-S3",))
    assert not any(tmp_path.iterdir())


def test_architecture_digest_tells_networks_apart_without_touching_the_random_state():
    from leaklab.models.perception import architecture_digest

    architecture_digest.cache_clear()  # every network built here, not read from an earlier test's digests
    torch.manual_seed(3)
    before = torch.get_rng_state()
    s1 = {arch: architecture_digest(PerceptionSpec(setting="S1", arch=arch)) for arch in ARCH_NAMES}
    assert torch.equal(torch.get_rng_state(), before)
    assert len(set(s1.values())) == len(ARCH_NAMES)
    assert architecture_digest(PerceptionSpec(setting="S2")) != s1[DEFAULT_ARCH]
    assert architecture_digest(PerceptionSpec(setting="S1")) == s1[DEFAULT_ARCH]
    # wide-rgb's S2 network is small's (its RGB stream alone is wider)
    assert architecture_digest(PerceptionSpec(setting="S2", arch="wide-rgb")) == \
        architecture_digest(PerceptionSpec(setting="S2", arch="small"))


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_a_network_built_on_the_meta_device_has_the_cpu_networks_shapes(arch):
    spec = PerceptionSpec(setting="S1", arch=arch, image_size=40)
    with torch.device("meta"):
        meta = PerceptionNet(spec)
    cpu = build_perception_net(spec, seed=0)
    assert meta.conv_features == cpu.conv_features
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in cpu.state_dict().items()}
    assert all(p.is_meta for p in meta.parameters())


def test_a_meta_build_does_not_import_torchs_meta_kernels():
    # the first forward pass on the meta device imports torch._dynamo and sympy (1.8 s a process, session 67)
    code = ("import sys, torch; from leaklab.models.perception import architecture_digest; "
            "from leaklab.models import PerceptionSpec; architecture_digest(PerceptionSpec(setting='S1')); "
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_every_architecture_builds_at_the_smallest_allowed_image_size(arch):
    spec = PerceptionSpec(setting="S1", arch=arch, image_size=36)
    net = build_perception_net(spec, seed=0)
    assert net(torch.rand(1, 4, 36, 36), torch.zeros(1, 4)).shape == (1, 7)
    with pytest.raises(ValueError):
        PerceptionSpec(setting="S1", arch=arch, image_size=35)


def test_a_user_class_that_fails_to_import_or_build_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_net.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LeaklabError, match="importing its module failed"):
        build_perception_net(PerceptionSpec(), model_class="broken_net:Net")
    with pytest.raises(LeaklabError, match="must build from a PerceptionSpec"):
        build_perception_net(PerceptionSpec(), model_class="torch.nn:Linear")


@pytest.mark.parametrize("where", ["import", "build", "forward"])
def test_a_user_class_that_calls_sys_exit_is_one_line(tmp_path, monkeypatch, where):
    """A training script's argparse at import (or any sys.exit) ended the command silently, exit code 0 even."""
    module = f"exits_in_{where}"
    (tmp_path / f"{module}.py").write_text(
        "import sys\nimport torch\n"
        + ("sys.exit(0)\n" if where == "import" else "")
        + "class Net(torch.nn.Module):\n"
        + "    def __init__(self, spec):\n        super().__init__()\n"
        + ("        sys.exit(0)\n" if where == "build" else "")
        + "        self.conv = torch.nn.Sequential(torch.nn.Conv2d(spec.in_channels, 2, 10, stride=10), "
          "torch.nn.Flatten())\n"
        + "        self.box = torch.nn.Sequential(torch.nn.Linear(4, 8))\n"
        + "        self.head = torch.nn.Sequential(torch.nn.Linear(2 * 15 * 15 + 8, 7))\n"
        + "    def forward(self, images, box):\n"
        + ("        sys.exit(0)\n" if where == "forward" else "")
        + "        return self.head(torch.cat([self.conv(images), self.box(box)], 1))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LeaklabError, match="SystemExit: 0"):
        build_perception_net(PerceptionSpec(), model_class=f"{module}:Net")


_USER_NETS = """
import torch
from torch import nn


class Good(nn.Module):
    def __init__(self, spec, actions=None, box_in=None):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(spec.in_channels, 2, 10, stride=10), nn.ReLU(), nn.Flatten())
        self.box = nn.Sequential(nn.Linear(box_in or spec.box_dim, 8), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(2 * 15 * 15 + 8, 16), nn.ReLU(), nn.Linear(16, actions or spec.num_actions))

    def forward(self, images, box):
        return self.head(torch.cat([self.conv(images), self.box(box)], 1))


class ThreeActions(Good):
    def __init__(self, spec):
        super().__init__(spec, actions=3)


class TwoBoxInputs(Good):
    def __init__(self, spec):
        super().__init__(spec, box_in=2)

    def forward(self, images, box):
        return super().forward(images, box[:, :2])


class ExtraAxis(Good):
    def forward(self, images, box):
        return super().forward(images, box)[..., None]


class Doubled(Good):
    def forward(self, images, box):
        return 2 * super().forward(images, box)


class InFloat64(Good):
    def __init__(self, spec):
        super().__init__(spec)
        self.double()

    def forward(self, images, box):
        return super().forward(images.double(), box.double())


class NormedHead(Good):
    def __init__(self, spec):
        super().__init__(spec)
        self.head.insert(1, nn.BatchNorm1d(16))


class FailsWhenTraining(Good):
    def forward(self, images, box):
        if self.training and len(images) == 1:
            raise ValueError("needs a batch")
        return super().forward(images, box)


class HoldsAComputedTensor(Good):
    def __init__(self, spec):
        super().__init__(spec)
        self.scaled = self.head[0].weight * 2  # not a leaf: deepcopy of the network fails


class NormedConv(Good):
    def __init__(self, spec):
        super().__init__(spec)
        self.conv.insert(1, nn.BatchNorm2d(2))
"""


@pytest.mark.parametrize("name, words", [("ThreeActions", "7 outputs (got 4 and 3)"), ("TwoBoxInputs", "got 2 and"),
                                         ("ExtraAxis", "(2, 7, 1)"), ("Doubled", "is not head(cat("),
                                         ("InFloat64", "has float64 parameters"), ("NormedHead", "BatchNorm in head.1"),
                                         ("FailsWhenTraining", "one state in train mode")])
def test_a_user_class_is_checked_against_the_spec_before_any_work(tmp_path, monkeypatch, name, words):
    """Such classes passed the module-name check and failed later, with a traceback, after the episodes
    were played (or after the attacks ran)."""
    (tmp_path / "user_nets.py").write_text(_USER_NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.manual_seed(5)
    __import__("user_nets").Good(PerceptionSpec())
    after_building = torch.get_rng_state()
    net = build_perception_net(PerceptionSpec(), seed=5, model_class="user_nets:Good")
    assert net.training and torch.equal(torch.get_rng_state(), after_building)  # the check draws nothing
    assert all(m.training for m in net.modules())  # each module back in its own mode
    with pytest.raises(LeaklabError, match=re.escape(words)):
        build_perception_net(PerceptionSpec(), model_class=f"user_nets:{name}")


def test_batchnorm_in_conv_is_accepted_and_the_checks_leave_its_statistics(tmp_path, monkeypatch):
    (tmp_path / "user_nets.py").write_text(_USER_NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = build_perception_net(PerceptionSpec(), seed=5, model_class="user_nets:NormedConv")
    norm = net.conv[1]
    assert norm.num_batches_tracked == 0 and torch.equal(norm.running_mean, torch.zeros(2))
    build_perception_net(PerceptionSpec(), model_class="user_nets:HoldsAComputedTensor")  # checked without a copy


def test_room_truth_out_of_range_is_refused():
    from leaklab.rl.cases import check_room_truth, truth_shapes
    from leaklab.threat import UpdateMetadata

    spec, meta = PerceptionSpec(setting="S2", image_size=36), UpdateMetadata(loss="dqn_mse")
    good = {k: torch.zeros(shape) for k, shape in truth_shapes(spec, meta).items()}
    good["action"] = torch.zeros(1, dtype=torch.long)
    check_room_truth(good, spec, meta)
    for name, scale, match in (("images", 255, r"\[0, 1\]"), ("depth", 255, r"\[0, 1\]"), ("box", 100, r"\[-1, 1\]")):
        bad = dict(good, **{name: torch.full_like(good[name], 0.5) * scale})
        with pytest.raises(LeaklabError, match=match):
            check_room_truth(bad, spec, meta)
    # integer Q-values were truncated (and scored inf), half precision shifted the metrics, a bool was an action
    for name, dtype, match in (("q_pred", torch.int64, "float32 or float64"), ("box", torch.float16, "float32"),
                               ("action", torch.bool, "int64")):
        with pytest.raises(LeaklabError, match=match):
            check_room_truth(dict(good, **{name: good[name].to(dtype)}), spec, meta)


@pytest.mark.parametrize("setting", ["S1", "S2"])
def test_a_room_truth_whose_channels_disagree_with_its_images_is_refused(setting):
    from leaklab.rl.cases import check_room_truth, truth_shapes
    from leaklab.threat import UpdateMetadata

    spec, meta = PerceptionSpec(setting=setting, image_size=36), UpdateMetadata(loss="dqn_mse")
    images = torch.rand(1, spec.in_channels, 36, 36, generator=torch.Generator().manual_seed(0))
    good = {k: torch.zeros(shape) for k, shape in truth_shapes(spec, meta).items()}
    good.update(images=images, depth=images[:, -1:].double(), action=torch.zeros(1, dtype=torch.long))
    if setting == "S1":
        good["rgb"] = images[:, :3].clone()
    check_room_truth(good, spec, meta)  # float64 depth of float32 images: the same values
    for name in ("depth", "rgb") if setting == "S1" else ("depth",):
        with pytest.raises(LeaklabError, match=f"'{name}' is not the {name} channels of 'images'"):
            check_room_truth(dict(good, **{name: good[name].flip(-1)}), spec, meta)
