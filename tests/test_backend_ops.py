"""Every op of the core, one registry of cases (as ggml's test-backend-ops): a case builds a small graph and
computes what it must give with numpy. Each case runs on every kernel table this CPU has (scalar, AVX2, AVX-512,
AMX where the CPU has it) against numpy, and on the stand-in device (a second CPU backend in memory space 1, copies
included) and on CUDA where there is one, against the CPU. `test_every_op_has_a_case` holds the registry to the
core's op enum: a new op adds its case to tests/support/op_cases.py.

The NEON table runs its own cases under qemu (tests/test_neon_cross.py) and the emulated AMX tiles theirs
(tests/test_amx.py): neither can run in this process."""
from __future__ import annotations

import pytest
from support.op_cases import ALL, CASES, ISAS, ON_CUDA, ON_DEVICES, Case, compare, run_case

from pyinfer import _core
from pyinfer._core import Op


def test_every_op_has_a_case():
    assert set(CASES) == set(Op.__members__.values())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op,case", ALL)
def test_op_against_numpy(op, case, isa):
    c, outs, engine = run_case(case, isa)
    compare(c, outs, c.want)
    assert op in set(engine.node_ops()), f"the case never ran {op.name}"


@pytest.mark.parametrize("op,case", ON_DEVICES)
def test_op_on_the_standin_device_equals_the_cpu(op, case):
    c, cpu, _ = run_case(case)
    _, dev, engine = run_case(case, device="cpu")
    compare(c, dev, [c.read(x) if c.read else x for x in cpu])
    assert Op.COPY in set(engine.node_ops())  # the inputs crossed into the device's memory


def _cuda() -> bool:
    if not _core.cuda_built():
        return False
    from pyinfer.place.device import cuda_devices

    return bool(cuda_devices())


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA build and a GPU (tests/test_cuda_ops.py goes further there)")
@pytest.mark.parametrize("op,case", ON_CUDA)
def test_op_on_cuda_equals_the_cpu(op, case):
    c, cpu, _ = run_case(case)
    _, dev, _ = run_case(case, device="cuda:0")
    compare(dataclass_replace(c, rtol=max(c.rtol, 1e-4), atol=max(c.atol, 1e-4)), dev,
            [c.read(x) if c.read else x for x in cpu])


def dataclass_replace(c: Case, **changes) -> Case:
    from dataclasses import replace

    return replace(c, **changes)
