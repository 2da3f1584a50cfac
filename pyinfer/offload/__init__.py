"""Beyond RAM: the bundle file, the resident-set program and the streamed FFN (PowerInfer-2 on a PC)."""
from .offloaded_ffn import OffloadedFfn, OffloadPlan, parse_size, plan_offload

__all__ = ["OffloadPlan", "OffloadedFfn", "parse_size", "plan_offload"]
