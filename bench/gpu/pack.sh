# The GPU pack: the programs a device call runs, built once and carried as .gpu-build/dsb.tgz, so
# that a fresh GPU machine unpacks them into /tmp/dsb (the programs' RUNPATH) instead of building.
# Sourced by bench/gpu/run.sh (on the GPU machine) and bench/gpu/cross_pack.sh (here, no GPU).
# A pack carries a stamp of the sources' contents and is used only for the same sources: after a
# fix, the old programs are refused, never tested by mistake.
PACKED="lib/libdeepspeed_cpp.so bin/gpt_train bin/bench_cpu_adam bin/bench_transfer bin/gpu_training_test
        bin/device_adam_gpu_test bin/onebit_gpu_test bin/pipeline_gpu_test
        bin/activation_checkpointing_gpu_test bin/flops_profiler_gpu_test"

source_stamp() {  # $1: the source tree
  (cd "$1" && find src include tests examples tools cmake CMakeLists.txt bench -type f \
     ! -name '*.sh' ! -name '*.py' ! -name '*.md' -print0 | LC_ALL=C sort -z | xargs -0 cat | sha1sum | cut -c1-40)
}

# pack_build ROOT BUILD OUT_TGZ [extra folder under /tmp]: the PACKED files of BUILD (which must be
# /tmp/dsb: the programs' RUNPATH names it), the stamp, and any extra folder (DeepSpeed's JIT).
# STAMP, when set, is the stamp taken before the build (a source edited during it is not in it).
pack_build() {
  local root=$1 build=$2 tgz=$3 extra=${4:-} have="" f
  for f in $PACKED; do [ -f "$build/$f" ] && have="$have dsb/$f"; done
  if [ -n "${STAMP:-}" ]; then echo "$STAMP"; else source_stamp "$root"; fi > "$build/source.stamp"
  local marks="dsb/source.stamp"
  [ -f "$build/cross_built" ] && marks="$marks dsb/cross_built"
  tar czf "$tgz" -C /tmp $marks $have $( [ -n "$extra" ] && [ -d "/tmp/$extra" ] && echo "$extra" )
  echo "$have"
}
