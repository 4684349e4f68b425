"""The lowering table of lowerings/registry.py: registration, platform kernels, each op's declared
category, bounds and namespace."""

import pathlib

import pytest

import lowerings
import runtime
from lowerings import LOWERINGS, lowering, registry
from lowerings.registry import KERNELS, bounds_of, category, lowering_for

_ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu.default"
_ATTENTION_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"

# The modules of lowerings/ that lower no op: the table, its runtime checks and a dtype helper.
_NOT_CATEGORIES = {"__init__", "registry", "bounds", "dtypes"}
_CATEGORIES = {
    path.stem for path in pathlib.Path(lowerings.__file__).parent.glob("*.py")
} - _NOT_CATEGORIES

# The project's own ops outside the ``lazy.`` namespace (none: every op of ours is lazy.*).
_NOT_NAMESPACED: dict[str, str] = {}
# PyTorch's op namespaces, and the project's own.
_NAMESPACES = ("aten.", "prims.", "lazy.")


@pytest.fixture
def scratch(monkeypatch):
    """An empty registry for the test's own registrations, the real one back afterwards."""
    monkeypatch.setattr(registry, "LOWERINGS", {})
    monkeypatch.setattr(registry, "KERNELS", {})
    monkeypatch.setattr(registry, "DECLARATIONS", {})


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="registered twice"):
        lowering("aten.add.Tensor")(lambda ctx, x, y: x + y)


def test_a_platform_kernel_comes_first_on_its_platform_and_may_decline(scratch):
    @lowering("test.op", category="elementwise")
    def generic(ctx, x):
        return ("generic", x)

    @lowering("test.op", platform="cuda")
    def cuda(ctx, x):
        return NotImplemented if x < 0 else ("cuda", x)

    assert registry.lowering_for("test.op", "cpu") is generic
    assert registry.lowering_for("test.op", "cuda")(None, 2) == ("cuda", 2)
    assert registry.lowering_for("test.op", "cuda")(None, -2) == ("generic", -2)  # declined
    assert registry.lowering_for("test.other", "cuda") is None
    assert registry.category("test.op") == "elementwise"  # the kernel declares no other


def test_platform_registrations_are_checked(scratch):
    with pytest.raises(ValueError, match="generic lowering of 'test.op' before a cuda kernel"):
        lowering("test.op", platform="cuda")(lambda ctx, x: x)
    lowering("test.op", category="elementwise")(lambda ctx, x: x)
    lowering("test.op", platform="cuda")(lambda ctx, x: x)
    with pytest.raises(ValueError, match="cuda lowering for 'test.op' registered twice"):
        lowering("test.op", platform="cuda")(lambda ctx, x: x)
    with pytest.raises(ValueError, match="unknown platform 'gpu'"):
        lowering("test.op", platform="gpu")
    with pytest.raises(ValueError, match="declared in category 'elementwise', not 'linalg'"):
        lowering("test.op", platform="tpu", category="linalg")(lambda ctx, x: x)
    with pytest.raises(ValueError, match="bounds belong to an op's generic registration"):
        lowering("test.op", platform="tpu", bounds=object())


def test_the_platform_kernels_of_the_table():
    assert set(KERNELS) == {
        (_ATTENTION, "cuda"),  # cuDNN's flash attention
        (_ATTENTION_BACKWARD, "cuda"),
        ("aten.pow.Tensor_Scalar", "cpu"),  # eager's products for a runtime exponent
    }
    assert lowering_for("aten.pow.Tensor_Scalar", "cuda") is LOWERINGS["aten.pow.Tensor_Scalar"]


def test_every_op_declares_a_lowering_module_as_its_category():
    assert {op: category(op) for op in LOWERINGS if category(op) not in _CATEGORIES} == {}
    assert _CATEGORIES == {category(op) for op in LOWERINGS}  # and each module lowers some op


def test_categories_are_the_registering_module():
    assert category("aten.add.Tensor") == "elementwise"
    assert category("aten.sum.default") == "reduction"
    assert category(_ATTENTION) == category(_ATTENTION_BACKWARD) == "attention"
    assert category("lazy.foreach") == "foreach"
    assert category("aten.index.Tensor") == category("aten.gather.default") == "indexing"
    assert category("aten.normal.Tensor_Tensor") == category("lazy.rng_advance") == "random"
    assert category("aten.avg_pool2d.default") == "convolution"  # registered as a partial
    # Registered by special.py through a helper of elementwise.py: special's.
    assert category("aten.special_bessel_j0.default") == "special"
    assert category("prims.frexp.default") == "special"
    assert category("lazy.fused_adam") == category("lazy.amp_unscale") == "optim"
    assert category("aten.no_such_op.default") is None


def test_runtime_op_category():
    assert runtime.op_category("aten.add.Tensor") == "elementwise"
    assert runtime.op_category("aten.no_such_op.default") is None
    assert runtime.op_category("data") is None


def test_ops_outside_a_namespace_are_the_listed_exceptions():
    outside = {op for op in LOWERINGS if not op.startswith(_NAMESPACES)}
    assert outside == set(_NOT_NAMESPACED)


def test_bounds_are_declared_with_the_index_ops():
    declared = {op for op in LOWERINGS if bounds_of(op) is not None}
    assert declared == {
        "aten.gather.default",
        "aten.scatter.src",
        "aten.scatter.value",
        "aten.scatter.reduce",
        "aten.scatter.value_reduce",
        "aten.scatter_add.default",
        "aten.scatter_reduce.two",
        "aten.index.Tensor",
        "aten.index_put.default",
        "aten.index_select.default",
        "aten.index_add.default",
        "aten.index_reduce.default",
        "aten.index_copy.default",
        "aten.index_fill.int_Scalar",
        "aten.index_fill.int_Tensor",
        "aten.embedding.default",
        "aten.take.default",
        "aten.put.default",
    }
    assert bounds_of("aten.index_add.default").above_1d == bounds_of("aten.gather.default")
