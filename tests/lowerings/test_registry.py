"""The lowering table of lowerings/registry.py: registration and each op's category."""

import pytest

import runtime
from lowerings import LOWERINGS, lowering
from lowerings.registry import category


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="registered twice"):
        lowering("aten.add.Tensor")(lambda ctx, x, y: x + y)


def test_category_is_the_registering_module():
    assert category("aten.add.Tensor") == "elementwise"
    assert category("aten.sum.default") == "reduction"
    assert category("aten.avg_pool2d.default") == "convolution"  # registered as a partial
    assert category("aten.no_such_op.default") is None
    assert all(category(op) != "functools" for op in LOWERINGS)


def test_runtime_op_category():
    assert runtime.op_category("aten.add.Tensor") == "elementwise"
    assert runtime.op_category("aten.no_such_op.default") is None
    assert runtime.op_category("data") is None
