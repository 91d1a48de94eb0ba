# Session 21, call 7: e2e decode at batch 1/4/16 with DISABLE_MMA_V3=1 (every Triton dot on
# mma.sync, as on the 4090's sm_89): this checkout (plane dots with x split in registers at
# 3-32 rows) against session 20's last commit (the joined swap tile), interleaved.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
export DISABLE_MMA_V3=1
decode_interleaved old21.tar
