# Sourced by the GPU scripts: installs the wheels carried in .whl/ and builds pyinfer (with CUDA where nvcc is;
# sm_90 only on a GPU machine, to build fast) into /tmp/pyinfer-site, once per machine. Sets PY and GPU (1 when
# nvidia-smi sees one) and puts both sites on PYTHONPATH. Run Python with -P where it imports pyinfer: the
# built one, not ./pyinfer (which has no _core).
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
GPU=0
if nvidia-smi -L >/dev/null 2>&1; then GPU=1; fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  echo "== $(date +%T) wheels carried along: $(ls .whl | tr '\n' ' ')"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=/tmp/pyinfer-site${PYTHONPATH:+:$PYTHONPATH}
SOURCES="$(find csrc cuda pyinfer CMakeLists.txt pyproject.toml -type f -not -name '*.pyc' | sort | xargs cat | sha256sum | cut -c1-16)"
if [ "$(cat /tmp/pyinfer-site/.built-from 2>/dev/null)" != "$SOURCES" ] || [ "${REBUILD:-0}" = 1 ]; then
  echo "== $(date +%T) build (CUDA when nvcc is there)"
  ARCH=""
  [ "$GPU" = 1 ] && ARCH="-DCMAKE_CUDA_ARCHITECTURES=90"
  export CMAKE_ARGS="${CMAKE_ARGS:-} $ARCH"
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  "$PY" -m pip install -q --no-build-isolation --no-deps --no-index --upgrade --target /tmp/pyinfer-site . \
    || { echo "BUILD FAILED"; exit 1; }
  echo "$SOURCES" > /tmp/pyinfer-site/.built-from  # a later call on the same warm machine skips the build
fi
"$PY" -P -c "from pyinfer import _core; print('cuda built:', _core.cuda_built(), 'devices:', _core.cuda_devices())"
# cuBLAS (prefill's matmuls) is opened at run time: point at one if the loader would not find it by name
if [ -z "${PYINFER_CUBLAS:-}" ]; then
  PYINFER_CUBLAS="$(ls /usr/local/cuda/lib64/libcublas.so.* /usr/local/cuda*/lib64/libcublas.so.* 2>/dev/null | head -1)"
  [ -n "$PYINFER_CUBLAS" ] || PYINFER_CUBLAS="$("$PY" -c "import glob, site; print((sorted(glob.glob(site.getsitepackages()[0] + '/nvidia/**/libcublas.so*', recursive=True)) or [''])[0])" 2>/dev/null)"
  [ -n "$PYINFER_CUBLAS" ] && export PYINFER_CUBLAS
fi
[ "$GPU" = 1 ] && "$PY" -P -c "from pyinfer import _core; print('cuBLAS:', _core.cublas_error() or 'loads (' + '${PYINFER_CUBLAS:-by name}' + ')')"
