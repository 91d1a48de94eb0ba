# Sourced by the benchmarks/gpu_*.sh device scripts: litestar wheels from .whl (carry them),
# this checkout installed, and a copy of tests/ and benchmarks/ in /tmp/checks to run GPU
# tests from (./edge_llm in the repository root would shadow the installed package).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation . || exit 1
export OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
rm -rf /tmp/checks && mkdir -p /tmp/checks && cp -r tests benchmarks /tmp/checks/
