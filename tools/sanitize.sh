#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every compiled kernel
# (configuration and problem variant), one small call each (tools/sanitize_cases.py: ragged tails,
# causal and local masks with rows that attend no key, softcap and ALiBi, grouped heads, lse), and
# reports each tool clean or unclean. Only our kernels are checked (--kernel-name), so PyTorch's own
# kernels neither slow the run down nor report hazards of their own.
#
#   bash tools/sanitize.sh [--log-dir DIR] [--tools "memcheck racecheck synccheck initcheck"]
#                          [--kernels SELECTION] [--jobs N] [--kernel-filter FILTER]
#
#   --log-dir DIR        where each tool's log (DIR/TOOL.log: the sanitizer's report) and the
#                        driver's output (DIR/TOOL.out) go; default profiles/sanitize
#   --tools LIST         the tools to run, space- or comma-separated; default all four
#   --kernels SELECTION  configurations, as for the tests: short forms separated by ';', or a set
#                        name (default: KERNELS if set, else every compiled one)
#   --jobs N             tools run at once on the GPU (default 4: all of them side by side)
#   --kernel-filter F    compute-sanitizer's --kernel-name filter selecting our kernels; default
#                        kns=_forward_kernel (a substring of every family's mangled kernel name:
#                        flash_forward_kernel, hopper_forward_kernel, the Hopper
#                        family's varlen_plan_forward_kernel, the split keys'
#                        combine_forward_kernel and the KV cache's append_forward_kernel)
#
# A tool is clean when its run ends with status 0, its summary reports no error (racecheck: no
# hazard, warnings included) and the driver found every result equal to the reference. The exit
# status is 0 if every tool is clean, 1 otherwise (2 for a usage error or a selection of no kernel).
# PYTHON selects the interpreter (default python3); COMPUTE_SANITIZER the sanitizer (default: the
# one on PATH, else $CUDA_HOME/bin or /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
LOG_DIR=profiles/sanitize
TOOLS="memcheck racecheck synccheck initcheck"
KERNELS_ARG=()
JOBS=4
KERNEL_FILTER=kns=_forward_kernel
# The exit status compute-sanitizer gives when the program succeeded but the tool found errors.
TOOL_ERROR_STATUS=86

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 2
}

while (($#)); do
    case $1 in
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --tools) TOOLS=${2//,/ }; shift 2 ;;
    --kernels) KERNELS_ARG=(--kernels "$2"); shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --kernel-filter) KERNEL_FILTER=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done

for tool in $TOOLS; do
    case $tool in
    memcheck | racecheck | synccheck | initcheck) ;;
    *) echo "unknown tool: $tool (memcheck, racecheck, synccheck, initcheck)" >&2; exit 2 ;;
    esac
done

SANITIZER=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
if [[ -z $SANITIZER ]]; then
    for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
        if [[ -x $candidate ]]; then
            SANITIZER=$candidate
            break
        fi
    done
fi
if [[ -z $SANITIZER ]]; then
    echo "compute-sanitizer not found: put it on PATH or set COMPUTE_SANITIZER" >&2
    exit 2
fi
mkdir -p "$LOG_DIR"

# What the driver would run: fails early (without a GPU too) on a bad selection.
"$PYTHON" tools/sanitize_cases.py --list "${KERNELS_ARG[@]}" >"$LOG_DIR/kernels.txt" || exit 2
echo "$(wc -l <"$LOG_DIR/kernels.txt") kernels ($LOG_DIR/kernels.txt), $($SANITIZER --version | tail -1)"

tool_options() {
    case $1 in
    # Padding after every allocation turns reads or writes just past a tensor into errors; with
    # the caching allocator off (below) every tensor is an allocation of its own. A faulting
    # kernel is stopped alone, so the kernels after it are still checked.
    memcheck) echo "--padding 4096 --destroy-on-device-error kernel" ;;
    racecheck) echo "--racecheck-report analysis" ;;
    *) echo "" ;;
    esac
}

# The comparison with the reference runs under memcheck only. Under the other tools PyTorch's own
# kernels, which the filter leaves uninstrumented, misbehave: racecheck fails on the reference's
# matrix products with "failed to handle a hardware exception" (an illegal address in cuBLAS), and
# initcheck reports host reads of their results as reads of uninitialized memory.
driver_options() {
    case $1 in
    memcheck) echo "" ;;
    *) echo "--no-check" ;;
    esac
}

run_tool() {
    local tool=$1
    local status=0
    # shellcheck disable=SC2046
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool "$tool" $(tool_options "$tool") \
        --kernel-name "$KERNEL_FILTER" --error-exitcode "$TOOL_ERROR_STATUS" --print-limit 1000 \
        --log-file "$LOG_DIR/$tool.log" \
        "$PYTHON" tools/sanitize_cases.py $(driver_options "$tool") "${KERNELS_ARG[@]}" >"$LOG_DIR/$tool.out" 2>&1 || status=$?
    echo "$status" >"$LOG_DIR/$tool.status"
}

started=$SECONDS
running=0
for tool in $TOOLS; do
    echo "running $tool ..."
    run_tool "$tool" &
    running=$((running + 1))
    if ((running >= JOBS)); then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

unclean=0
printf '\n%-10s %-8s %s\n' tool result details
for tool in $TOOLS; do
    status=$(cat "$LOG_DIR/$tool.status")
    log=$LOG_DIR/$tool.log
    # memcheck, synccheck, initcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY:
    # N hazards displayed (E errors, W warnings)".
    summary=$(grep -Eo '(ERROR|RACECHECK) SUMMARY: [0-9]+ [a-z]+.*' "$log" 2>/dev/null | tail -1 || true)
    reported=$(grep -Eo 'SUMMARY: [0-9]+' <<<"$summary" | grep -Eo '[0-9]+' || true)
    kernels=$(grep -Eo 'flash_forward_kernel<.*>\(flash::ForwardParams\)' "$log" 2>/dev/null | sort -u | wc -l || true)
    driver=$(tail -1 "$LOG_DIR/$tool.out" 2>/dev/null || true)
    if [[ $status == 0 && -n $reported && $reported == 0 ]]; then
        result=clean
    else
        result=UNCLEAN
        unclean=1
    fi
    details="${summary:-no summary in the log}; exit status $status; driver: ${driver:-no output}"
    if ((kernels > 0)); then
        details+="; $kernels distinct kernels named in the report"
    fi
    printf '%-10s %-8s %s\n' "$tool" "$result" "$details"
done
echo
echo "logs in $LOG_DIR (TOOL.log: the sanitizer's report; TOOL.out: the driver's output); $((SECONDS - started)) s"
if ((unclean)); then
    echo "status $TOOL_ERROR_STATUS: the tool found errors; any other nonzero status: the driver failed" \
        "(a call raised or a result differed from the reference: see TOOL.out)"
fi
exit "$unclean"
