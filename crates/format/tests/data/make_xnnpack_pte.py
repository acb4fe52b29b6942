"""Regenerates xnnpack_linear.pte: a tiny linear layer delegated to XNNPACK, so the
format tests cover delegate payloads in segments and named data (weights).

Run with the fixture toolchain: tools/fixtures/.venv/bin/python \
    crates/format/tests/data/make_xnnpack_pte.py
"""

import pathlib

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

torch.manual_seed(0)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.linear(x)) + 1.0


exported = torch.export.export(Model().eval(), (torch.randn(2, 8),))
program = to_edge_transform_and_lower(
    exported, partitioner=[XnnpackPartitioner()]
).to_executorch()
out = pathlib.Path(__file__).with_name("xnnpack_linear.pte")
out.write_bytes(program.buffer)
print(out, out.stat().st_size)
