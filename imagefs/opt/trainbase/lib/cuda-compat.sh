# trainbase: CUDA forward compatibility for the runtimes that do not select it themselves.
# Sourced (POSIX sh) by /opt/trainbase/env.sh, which the image's entry points in /usr/local/bin
# source when a runtime starts them with the host's environment (bare ch-run, Apptainer
# --cleanenv; see tb-entrypoints). Changes nothing but LD_LIBRARY_PATH.
#
# The Ubuntu rows' nvidia/cuda base carries NVIDIA's forward-compatibility libraries in
# /usr/local/cuda/compat (libcuda.so.<driver>: the user-mode driver of the branch the image's
# CUDA came with). NVIDIA's container runtime uses them by itself, when the host driver's branch
# is older than theirs (libnvidia-container's cuda-compat-mode: "ldconfig" by default since the
# toolkit's 1.18, "mount" before; the enable-cuda-compat hook for CDI). Apptainer --nv,
# Charliecloud and the like do not; this does it here, under the same rule, and only where NVIDIA
# supports it:
#   - the host driver's branch (/proc/driver/nvidia/version) is older than the compat libcuda's;
#   - it is one of the branches the image's NVIDIA_REQUIRE_CUDA admits for it (the base's
#     brand=...,driver>=N,driver<N+1 alternatives; TB_CUDA_COMPAT_BRANCHES, written into env.sh
#     when the image was built);
#   - no GPU is a GeForce or a TITAN (/proc/driver/nvidia/gpus/*/information): forward
#     compatibility is for data-center GPUs (CUDA error 804 elsewhere).
# On a driver of the compat library's branch or newer it takes the directory off LD_LIBRARY_PATH:
# forced there, every CUDA call fails with error 803. TRAINBASE_CUDA_COMPAT=0 never uses it, =1
# always does (where the image has it); `tb-doctor --only gpu.forward_compat` says which way this
# node runs and why. TRAINBASE_CUDA_COMPAT_ROOT is for tests only: a directory standing for /.
_tb_cuda_compat() {
    _tb_dir=/usr/local/cuda/compat
    _tb_root=${TRAINBASE_CUDA_COMPAT_ROOT:-}
    _tb_compat=
    for _tb_f in "$_tb_root$_tb_dir"/libcuda.so.*.*; do
        [ -e "$_tb_f" ] && _tb_compat=${_tb_f##*/libcuda.so.}
    done
    [ -n "$_tb_compat" ] || return 0
    _tb_compat=${_tb_compat%%.*}
    _tb_host=$(awk '/Kernel Module/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+(\.[0-9]+)?$/) { split($i, v, "."); print v[1]; exit } }' \
        "$_tb_root/proc/driver/nvidia/version" 2>/dev/null)
    case ":${LD_LIBRARY_PATH:-}:" in *":$_tb_dir:"*) _tb_on=1 ;; *) _tb_on=0 ;; esac
    case ${TRAINBASE_CUDA_COMPAT:-auto} in
        0 | off | no | false) _tb_want=0 ;;
        1 | on | yes | true) _tb_want=1 ;;
        *)
            [ -n "$_tb_host" ] || return 0  # no driver here to compare with: leave it as it is
            _tb_want=0
            if [ "$_tb_host" -lt "$_tb_compat" ]; then
                case " ${TB_CUDA_COMPAT_BRANCHES:-} " in *" $_tb_host "*) _tb_want=1 ;; esac
                for _tb_f in "$_tb_root"/proc/driver/nvidia/gpus/*/information; do
                    [ -e "$_tb_f" ] || continue
                    case $(awk '/^Model:/' "$_tb_f") in *GeForce* | *TITAN* | *Titan*) _tb_want=0 ;; esac
                done
            fi
            ;;
    esac
    if [ "$_tb_want" = 1 ] && [ "$_tb_on" = 0 ]; then
        LD_LIBRARY_PATH=$_tb_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LD_LIBRARY_PATH
    elif [ "$_tb_want" = 0 ] && [ "$_tb_on" = 1 ]; then
        _tb_new=
        _tb_rest=$LD_LIBRARY_PATH:
        while [ -n "$_tb_rest" ]; do
            _tb_p=${_tb_rest%%:*}
            _tb_rest=${_tb_rest#*:}
            [ "$_tb_p" = "$_tb_dir" ] || _tb_new=${_tb_new:+$_tb_new:}$_tb_p
        done
        LD_LIBRARY_PATH=$_tb_new
        export LD_LIBRARY_PATH
    fi
}
_tb_cuda_compat
unset -f _tb_cuda_compat
unset _tb_dir _tb_root _tb_compat _tb_f _tb_host _tb_on _tb_want _tb_new _tb_rest _tb_p
