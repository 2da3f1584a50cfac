"""Qwen3-Next (`qwen3next`, Qwen3-Next-80B-A3B): Qwen 3.5's layers before Qwen 3.5 (model/arch/qwen35.py) with three
differences of llama.cpp's qwen3next graph: value head h reads key head h / (value heads / key heads) (a
repeat-interleave; Qwen 3.5's converter reorders its value heads so that h mod key heads serves), beta and alpha come
from one fused `ssm_ba` (per key head, its value heads' beta rows then their alpha rows; presented as two tensors),
and RoPE is plain NEOX without M-RoPE sections. The FFN is a Mixture of Experts with a gated shared expert, as
qwen35moe's. Files of the legacy fused `ssm_in` layout are refused by name."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import LlamaConfig
from .qwen35moe import Qwen35Moe


class Qwen3Next(Qwen35Moe):
    name = "qwen3next"
    tensor_patterns = Qwen35Moe.tensor_patterns

    def config(self, f) -> LlamaConfig:
        return replace(super().config(f), ssm_grouped_heads=True)

    def present(self, f) -> None:
        if any(n.endswith(".ssm_in.weight") for n in f.tensors):
            raise UnsupportedModelError(f"{f.path.name}: the legacy fused ssm_in layout of qwen3next is not supported; "
                                        "convert the model again with a current llama.cpp (attn_qkv and attn_gate)")
        super().present(f)
        from ..gguf_file import GGUFTensor

        p = self.name + "."
        hk, hv = int(f.get(p + "ssm.group_count", 0) or 0), int(f.get(p + "ssm.time_step_rank", 0) or 0)
        for name in [n for n in f.tensors if n.endswith(".ssm_ba.weight")]:
            t = f.tensors.pop(name)
            if hk < 1 or hv % hk or t.rows != 2 * hv:
                raise ModelFormatError(f"{f.path.name}: {name} has {t.rows} rows; beta and alpha of {hv} value heads "
                                       f"in {hk} groups need {2 * hv}")
            data = np.asarray(t.data).reshape(t.rows, -1)
            groups = data.reshape(hk, 2, hv // hk, data.shape[1])
            for part, half in (("ssm_beta", 0), ("ssm_alpha", 1)):
                new = name.replace(".ssm_ba.", f".{part}.")
                f.tensors[new] = GGUFTensor(new, t.type_name, t.cols, hv,
                                            np.ascontiguousarray(groups[:, half]).reshape(hv, data.shape[1]))


ARCH = Qwen3Next()
