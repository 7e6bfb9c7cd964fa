#!/usr/bin/env python3
"""Writes an F32 copy of a GGUF model: the same metadata, every weight dequantized to F32 exactly as
kvpolicy-gguf-to-lm gives it to kvpolicy-lm.

    python -m kvpolicy_tools.convert.gguf_dequantize MODEL.gguf OUT.gguf

llama.cpp multiplies Q4_1 weights by activations it first rounds to Q8_1 (8 bits per block of 32),
so on the quantized file it and kvpolicy-lm (F32 activations) differ by about 0.16 in a logit. On
this F32 copy both run the same arithmetic on the same weights, so the golden data
kvpolicy_tools.eval.llama_golden makes from it checks the decoder to rounding (tests/lm, --golden-strict).

Needs the `gguf` and `numpy` packages (tools/fetch-model.sh makes a venv with them).
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from kvpolicy_tools.convert.gguf_to_lm import weights_of  # the one dequantizer

FILE_TYPE_ALL_F32 = 0  # llama.cpp's LLAMA_FTYPE_ALL_F32


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    reader = GGUFReader(src)
    writer = GGUFWriter(dst + ".tmp", reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        if name == "general.file_type":
            writer.add_key_value(name, FILE_TYPE_ALL_F32, GGUFValueType.UINT32)
            continue
        kind = f.types[0]
        writer.add_key_value(name, f.contents(), kind, f.types[-1] if kind == GGUFValueType.ARRAY else None)
    weights = weights_of(reader, None)
    for t in reader.tensors:
        writer.add_tensor(t.name, weights[t.name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # check what was written: every tensor F32 and equal to the dequantized source
    back = GGUFReader(dst + ".tmp")
    if len(back.tensors) != len(reader.tensors):
        sys.exit(f"gguf_dequantize: wrote {len(back.tensors)} tensors, not {len(reader.tensors)}")
    for t in back.tensors:
        w = np.asarray(t.data).reshape(weights[t.name].shape)
        if w.dtype != np.float32 or not np.array_equal(w, weights[t.name]):
            sys.exit(f"gguf_dequantize: {t.name} did not read back as written")
    os.replace(dst + ".tmp", dst)
    print(f"gguf_dequantize: {len(back.tensors)} tensors as F32 -> {dst}")


if __name__ == "__main__":
    main()
