"""Every case of tests/test_backend_ops.py in a timing mode: the same graph, checked once against numpy, then its
engine run timed per kernel table. The cases are small (they test, they do not load the memory roof): use
bench/test_bench_kernels.py and bench/test_bench_roof.py for speed at real shapes; these show what an op costs
at its smallest and that every table runs it.

  pytest bench/test_bench_backend_ops.py --benchmark-json bench/results/kernels/backend_ops.json"""
import pytest
from support.op_cases import ALL, ISAS, compare, run_case


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op,case", ALL)
def test_backend_op(benchmark, op, case, isa):
    c, outs, engine = run_case(case, isa)
    compare(c, outs, c.want)  # checked once before timing
    benchmark(engine.run, c.n_tokens, **c.run_kw)
