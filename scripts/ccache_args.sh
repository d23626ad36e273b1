# Sourced by scripts/setup.sh and scripts/san-configure.sh: sets `launcher` to the CMake
# arguments that compile through ccache where it is installed (scripts/setup.sh installs it),
# empty otherwise. Paths under this checkout are hashed relative to it (CCACHE_BASEDIR, and
# CCACHE_NOHASHDIR for the builds with debug info), so a clean clone elsewhere, as CI makes,
# finds what an earlier clone compiled.
launcher=()
if command -v ccache >/dev/null; then
  cc_launcher="env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;ccache"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER="$cc_launcher" -DCMAKE_CXX_COMPILER_LAUNCHER="$cc_launcher"
            -DCMAKE_CUDA_COMPILER_LAUNCHER="$cc_launcher")
fi
