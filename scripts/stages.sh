# Sourced by .ci/run and scripts/test.sh: wall time per stage, so the run that makes CI slower says
# where (issue 72). `stage NAME` closes the open stage and opens NAME; the table is printed and
# appended to reports/stages.tsv (stage<TAB>seconds<TAB>status) when the script exits, also on a
# failure, which names the stage it died in.
_stage_name=""
_stage_t0=$SECONDS
_stage_rows=()
_stage_close() {
  local status="$1"
  [ -n "$_stage_name" ] || return 0
  local took=$((SECONDS - _stage_t0))
  _stage_rows+=("$(printf '%-58s %5dm%02ds  %s' "$_stage_name" $((took / 60)) $((took % 60)) "$status")")
  mkdir -p reports
  printf '%s\t%d\t%s\n' "$_stage_name" "$took" "$status" >> reports/stages.tsv
  _stage_name=""
}
stage() {
  _stage_close ok
  _stage_name="$1"
  _stage_t0=$SECONDS
  echo "==> $1"
}
_stage_report() {
  local rc=$?
  if [ "$rc" = 0 ]; then _stage_close ok; else _stage_close "FAILED (exit $rc)"; fi
  if [ "${#_stage_rows[@]}" -gt 0 ]; then
    echo "==> time per stage (${STAGES_OF:-this run}):"
    printf '    %s\n' "${_stage_rows[@]}"
    printf '    %-58s %5dm%02ds\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
  fi
  return "$rc"
}
trap _stage_report EXIT
