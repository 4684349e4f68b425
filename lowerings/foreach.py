"""``foreach``: one node applying an element op to each entry of tensor lists (``_foreach_*``).

Its arguments are the element op's name, every operand, and per element that op's (args, kwargs)
template (``lazy_core.ir.Elements``: markers count from the element's first operand) and how many
operands it takes; output ``i`` is the element lowering of entry ``i`` (the platform's kernel
where it has one).
"""

from __future__ import annotations

from typing import Any

from lazy_core.ir import fill
from lowerings.registry import LoweringContext, lowering, lowering_for


@lowering("lazy.foreach")
def _foreach(
    ctx: LoweringContext, op: str, operands: tuple, elements: tuple, counts: tuple[int, ...]
) -> tuple:
    fn = lowering_for(op, ctx.platform)
    outputs: list[Any] = []
    start = 0
    for i, ((args, kwargs), n) in enumerate(zip(elements, counts)):
        values = operands[start : start + n]
        start += n
        outputs.append(
            fn(ctx.output(i), *fill(args, values), **{k: fill(v, values) for k, v in kwargs})
        )
    return tuple(outputs)
