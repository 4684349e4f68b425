"""A loop with two classic lazy-tensor mistakes, for docs/debugging.md.

LAZY_DEBUG=1 python examples/debug_demo.py

The batch size changes every step (every step compiles a new graph) and ``loss.item()`` inside
the step cuts the graph early (a sync per step). LAZY_DEBUG's lines and the metrics report name
both, with the lines of this file that cause them.
"""

import torch

import lazy_torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 4).to("lazy")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8 + step, 16).to("lazy")  # the batch grows: a new graph every step
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step}: loss {loss.item():.3f}")  # a sync inside the step
    lazy_torch.mark_step()
print(lazy_torch.metrics.report())
