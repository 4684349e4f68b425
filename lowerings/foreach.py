"""``foreach``: one node applying an element op to each entry of tensor lists (``_foreach_*``).

Its arguments are the element op's name and, per element, that op's (args, kwargs) with operands
filled in; output ``i`` is the element lowering of entry ``i``.
"""

from __future__ import annotations

from lowerings.registry import LOWERINGS, LoweringContext, lowering


@lowering("foreach")
def _foreach(ctx: LoweringContext, op: str, elements: tuple) -> tuple:
    fn = LOWERINGS[op]
    return tuple(
        fn(ctx.output(i), *args, **dict(kwargs)) for i, (args, kwargs) in enumerate(elements)
    )
