# Session 18, call 6: decode at batch 1/4/16 of this session's code against session 17's last
# commit (aeaded5, unpacked from old18.tar), interleaved new/old/new/old in one call.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
decode_interleaved old18.tar
