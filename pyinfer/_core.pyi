"""Stubs for the C++ core (csrc/bindings/module.cpp)."""
from __future__ import annotations

import enum
from typing import Mapping, Optional, Sequence

import numpy as np
import numpy.typing as npt

class GraphError(ValueError): ...

def op_signature(op: Op) -> dict: ...  # {"sources": [slot names], "params": [(name, "int" | "float")]}

class DType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I32 = 26
    BF16 = 30
    MXFP4 = 39
    Q8A = 1000
    Q4T = 1001

class Op(enum.IntEnum):
    GET_ROWS = 0
    RMS_NORM = 1
    QUANTIZE = 2
    MAT_MUL = 3
    ROPE = 4
    KV_STORE = 5
    ATTENTION = 6
    ADD = 7
    SILU_MUL = 8
    SELECT_ROWS = 9
    BIAS_RELU = 10
    ACTIVE_SET = 11
    GATED_ACT = 12
    DOWN_AXPY = 13
    SCATTER_COLS = 14
    ACTIVE_UNION = 15
    NEURON_FETCH = 16
    COPY = 17
    MOE_ROUTE = 18
    MOE_MAT_MUL = 19
    MOE_COMBINE = 20
    EXPERT_FETCH = 21
    MOE_ROUTE_SPLIT = 22

class RunIf(enum.IntEnum):
    ALWAYS = 0
    SINGLE_TOKEN = 1
    MULTI_TOKEN = 2

class RowMode(enum.IntEnum):
    FIXED = 0
    TOKENS = 1
    OUTPUTS = 2

class Storage(enum.IntEnum):
    EXTERNAL = 0
    SCRATCH = 1
    STATE = 2
    INPUT = 3

N_OP_KINDS: int  # op kinds the core knows (sizes per-op tables such as op timing)

def available_isas() -> str: ...
def read_bandwidth(bytes: int, threads: int, repeats: int = 5) -> float: ...
def row_bytes(dtype: DType, n: int) -> int: ...
def neuron_major(src: npt.NDArray[np.uint8], dtype: DType, cols: int, perm: npt.NDArray[np.int32], out: DType,
                 threads: int = 1) -> npt.NDArray[np.uint8]: ...
def gate_cut_bounds(gate_fn: int, thresholds: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
def cuda_built() -> bool: ...
def cuda_devices() -> list[dict]: ...
def cuda_sync_seconds(bytes: int, reps: int = 200, device: int = 0) -> float: ...  # CUDA builds only
def cublas_error() -> str: ...  # CUDA builds only

class NeuronStore:
    """A bundle file's neurons: resident prefixes in RAM, cold tails streamed or read by list."""
    def __init__(self, path: str, layers: Sequence[dict], ring_slots: int = 2, direct_io: bool = True,
                 io_threads: int = 4, cache_bytes: int = 0, io_uring: bool = True, merge_gap: int = 8192,
                 max_range: int = 262144) -> None: ...
    def fetch(self, layer: int, ids: Optional[npt.ArrayLike] = None) -> None: ...  # tests
    def fetch_dense(self, layer: int) -> None: ...  # tests
    def release(self, layer: int) -> None: ...  # tests
    def row(self, layer: int, part: int, row: int, n_bytes: int) -> bytes: ...    # tests
    def stats(self) -> dict: ...
    def reset_stats(self) -> None: ...
    @property
    def n_layers(self) -> int: ...

class ExpertStore:
    """A MoE model's experts outside RAM: resident experts, a cache of slots (lru or lfu), reads on a miss."""
    def __init__(self, path: str, layers: Sequence[dict], cache_slots: int, policy: str = "lru",
                 io_threads: int = 8, io_uring: bool = True, direct_io: bool = True) -> None: ...
    def fetch(self, layer: int, route: npt.ArrayLike, k: int) -> None: ...          # tests
    def prefetch(self, layer: int, route: npt.ArrayLike, k: int) -> None: ...       # tests
    def expert(self, layer: int, part: int, expert: int) -> Optional[bytes]: ...     # tests
    def stats(self) -> dict: ...
    def chosen(self) -> list[list[int]]: ...
    def reset_stats(self) -> None: ...
    @property
    def n_layers(self) -> int: ...

class Graph:
    input_tokens: int
    input_positions: int
    input_out_ids: int
    input_slots: int
    input_kv_table: int
    output_logits: int
    def __init__(self) -> None: ...
    def add_weight(self, name: str, dtype: DType, cols: int, rows: int, data: object) -> int: ...
    def add_paged_weight(self, name: str, dtype: DType, cols: int, rows: int, store: NeuronStore, layer: int,
                         part: int) -> int: ...
    def add_expert_weight(self, name: str, dtype: DType, cols: int, rows: int, store: ExpertStore, layer: int,
                          part: int) -> int: ...
    def row_stride(self, id: int) -> int: ...
    def add_view(self, name: str, base: int, cols: int, rows: int = 0, offset: int = 0,
                 row_stride: int = 0) -> int: ...
    def add_tensor(self, name: str, dtype: DType, cols: int, row_mode: RowMode, storage: Storage,
                   rows: int = 0) -> int: ...
    def add_node(self, op: Op, dst: int, src: Mapping[str, int], params: Mapping[str, float | int] = ...,
                 run_if: RunIf = ..., max_tokens: int = ..., when_list: int = ..., when_sparse: bool = ...,
                 min_tokens: int = ...) -> int: ...
    def validate(self) -> None: ...
    def pin(self, id: int) -> None: ...
    @property
    def n_tensors(self) -> int: ...
    @property
    def n_nodes(self) -> int: ...

class Engine:
    def __init__(self, graph: Graph, max_tokens: int = 512, max_outputs: int = 1, n_threads: int = 1,
                 isa: str = "auto", backend_threads: Sequence[int] = ..., placement: Sequence[int] = ...,
                 backend_memory: Sequence[int] = ...) -> None: ...
    @property
    def n_copies(self) -> int: ...
    @property
    def n_uploads(self) -> int: ...
    @property
    def device_bytes(self) -> int: ...
    def node_ops(self) -> list[Op]: ...
    def node_names(self) -> list[str]: ...
    def run(self, n_tokens: int, tokens: Optional[npt.ArrayLike] = None, positions: Optional[npt.ArrayLike] = None,
            out_ids: Optional[npt.ArrayLike] = None,
            slots: Optional[npt.ArrayLike] = None, kv_table: Optional[npt.ArrayLike] = None) -> None: ...
    def logits(self) -> npt.NDArray[np.float32]: ...  # read-only view, overwritten by the next run
    def tensor(self, id: int, rows: int) -> np.ndarray: ...  # read-only view
    def reserve_memory(self) -> None: ...
    def _inject_fault(self, node: int, thread: int, backend: int = 0) -> None: ...
    @property
    def n_segments(self) -> int: ...
    def segments(self) -> list[dict]: ...  # backend, nodes, deps per segment
    def set_timeline(self, on: bool) -> None: ...
    def timeline(self) -> list[tuple[int, int, float, float]]: ...  # (segment, backend, start s, end s)
    def set_op_timing(self, on: bool) -> None: ...
    def op_timing(self) -> dict[str, tuple[float, int]]: ...
    def node_timing(self) -> np.ndarray: ...
    @property
    def isa(self) -> str: ...
    @property
    def n_threads(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def max_outputs(self) -> int: ...
    @property
    def scratch_bytes(self) -> int: ...
    @property
    def state_bytes(self) -> int: ...
