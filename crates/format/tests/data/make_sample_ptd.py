"""Regenerates sample.ptd with ExecuTorch's own FlatTensor serializer.

Run with the fixture toolchain: tools/fixtures/.venv/bin/python \
    crates/format/tests/data/make_sample_ptd.py
"""

import pathlib
import struct

from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
from executorch.exir.scalar_type import ScalarType
from executorch.exir.tensor_layout import TensorLayout
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

weight = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
bias = struct.pack("<3q", 7, 8, 9)
blob = bytes(range(10))
payload = DataPayload(
    buffers=[weight, bias, blob],
    named_data={
        "linear.weight": DataEntry(0, 16, TensorLayout(ScalarType.FLOAT, [2, 3], [0, 1])),
        "linear.bias": DataEntry(1, 16, TensorLayout(ScalarType.LONG, [3], [0])),
        "weight_alias": DataEntry(0, 16, TensorLayout(ScalarType.FLOAT, [3, 2], [1, 0])),
        "opaque": DataEntry(2, 64, None),
    },
)
out = pathlib.Path(__file__).with_name("sample.ptd")
out.write_bytes(bytes(FlatTensorSerializer().serialize(payload)))
print(out, out.stat().st_size)
