"""Serving: schedulers (A_min, A_max, H-SF, FCFS) over a KV block manager, and a simulator.

Schedulers and the block manager deal only in integers and plain data, never tensors, so the
same objects drive the simulator and (later) the engine's continuous batcher."""
