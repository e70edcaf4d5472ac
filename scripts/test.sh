#!/usr/bin/env bash
# trainbase's test command (what .ci/run runs after scripts/setup.sh):
#   1. the drift check  (images/ and locks/ equal a fresh render of matrix.yaml + templates/)
#   2. hadolint on every rendered Dockerfile, and the pipefail rule (no pipeline that can die of
#      SIGPIPE by chance: rendered RUN lines, workflows, scripts, in-image tools)
#   3. the build of the `ci` profile through the Docker engine (when one answers)
#   3b. mutation testing of the checks against their unit evidence (beside the build)
#   4. pytest: unit tests (both cores), then the build tests and the conformance suite (static, cpu, multinode, azureml, runtime
#      tiers; gpu/fabric skip with their reason) against the images built in step 3; then the
#      suite's self-test (broken variants of a real image must fail the right checks; that
#      they pass on the real image, its control, is what this pytest run found)
#   5. the suite as users install it: its wheel built, installed into a fresh venv from the
#      hash-locked requirements, and `trainbase-conformance` run from outside the checkout on
#      one built image (one tier) -- scripts/installed-suite.sh; and on Azure ML's published recipe
#      rebuilt here, with an expectations file, whose failures must be the recorded ones
#      (scripts/foreign-image.sh, tests/foreign/)
# Reports (JUnit, JSON, logs) land in reports/.
#
# Two scopes. The default is .ci/run's gate: every step above, less the build tests marked
# `slow` (minutes each of no-cache rebuilds, pushes of 3 GB cells and week-long delivery
# replays: about 20 of the gate's minutes on 2 cores). `--full` runs those too, and is what
# ci.yml's local-profile job runs on every pull request, so a merge still waits on each of them.
set -euo pipefail
SCOPE=gate
for arg in "$@"; do
  case "$arg" in
    --full) SCOPE=full ;;
    *) echo "test: unknown argument '$arg' (the only one is --full)" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "test: run scripts/setup.sh first (no .venv)" >&2; exit 2; }
mkdir -p reports
STAGES_OF="scripts/test.sh"
# shellcheck source=scripts/stages.sh
source "$REPO/scripts/stages.sh"
PROFILE="${TRAINBASE_TEST_PROFILE:-ci}"

stage "drift check"
"$PY" build.py check

stage "hadolint + pipefail rule"
"$PY" build.py lint > reports/hadolint.txt || { cat reports/hadolint.txt; exit 1; }
tail -n 2 reports/hadolint.txt

# Mutation testing of the checks against their unit evidence (scripts/mutation.sh: each check made a
# no-op and each of its asserts negated/removed must make its named evidence fail, or be a recorded
# survivor with its reason). It needs no engine, so it runs beside the image build (whose time is
# mostly waiting on downloads and one compile), not after it: 3-4 minutes of wall time saved.
# Incremental: a check whose evidence reads nothing that changed since the record keeps its recorded
# outcomes (tests/conformance/inputs.py); TRAINBASE_MUTATION_FULL=1 re-runs every check (ci.yml's
# local-profile job does, so a pull request always gets the full run).
echo "==> mutation testing of the checks (beside the build; log: reports/mutation.log)"
nice -n 10 bash scripts/mutation.sh ${TRAINBASE_MUTATION_FULL:+--full} > reports/mutation.log 2>&1 &
mutation_pid=$!
mutation_result() {
  if wait "$mutation_pid"; then grep -E "mutants of [0-9]+ checks|keep their recorded outcomes" reports/mutation.log || tail -n 3 reports/mutation.log
  else echo "mutation testing failed:"; tail -n 40 reports/mutation.log; return 1
  fi
}

# The unit tests need no engine and share nothing between tests (each writes under its own
# tmp_path or a scratch copy): on both cores (pytest-xdist) they take about half the wall time.
# --durations: the slowest tests by name, so a test that makes CI slower is seen in its own run.
# hadolint over every rendered Dockerfile is the stage above (build.py lint): not again here.
unit_tests=("$PY" -m pytest tests/unit -n "${TRAINBASE_TEST_WORKERS:-2}" --junitxml=reports/junit-unit.xml
            --durations=15 --durations-min=20
            --deselect tests/unit/test_lint.py::test_hadolint_is_clean_on_every_rendered_dockerfile)
unit_result() {
  if wait "$unit_pid"; then
    sed -n '/slowest [0-9]* durations/,$p' reports/unit.log | grep -vE "^SKIPPED|short test summary" || tail -n 3 reports/unit.log
  else echo "unit tests failed:"; tail -n 80 reports/unit.log; return 1
  fi
}

pytest_args=()
built=0
if "$PY" -c 'import sys; from trainbase_common import engine; sys.exit(0 if engine.available() else 1)' >/dev/null 2>&1; then
  built=1
  # Beside the build, at a lower priority: they take the cores the build leaves idle (its
  # downloads, the bootstrap, single-threaded configure scripts, layer exports) and yield to
  # its compiles, so the build's own time stays what it was; unlike the build they need no
  # engine (docs/ci.md has what this saves, measured).
  echo "==> unit tests (beside the build, nice 10; log: reports/unit.log)"
  nice -n 10 "${unit_tests[@]}" > reports/unit.log 2>&1 &
  unit_pid=$!
  stage "build profile '$PROFILE'"
  "$PY" build.py --matrix --profile "$PROFILE" --report reports/build.json --log-dir reports/logs
  stage "mutation testing: waiting for its result"
  mutation_result
  # a framework image built FROM a base of this run: its static and cpu tiers (the framework's
  # build, pins, GPU-path checks, torch.compile, doctor); its multinode, azureml and runtime
  # tiers (4-rank DDP in every Azure ML mode, the runtime conversions of a 7.8 GB image:
  # over 25 minutes on 2 cores) run in build-cells.yml on every image. The summary says so.
  pytest_args+=(tests/build trainbase_conformance/checks --report reports/build.json
                --derived-tiers "${TRAINBASE_DERIVED_TIERS:-static,cpu}")
  if [ "$SCOPE" = gate ]; then
    pytest_args+=(-m "not slow")
    echo "==> scope: gate (the build tests marked slow are left to 'scripts/test.sh --full', ci.yml's local-profile job)"
  fi
  export TRAINBASE_BUILD_REPORT="$REPO/reports/build.json"
else
  echo "==> no Docker engine answers: skipping image builds (the build tests will say so)"
fi

if [ "$built" = 0 ]; then
  stage "mutation testing: waiting for its result"
  mutation_result
fi

if [ "$built" = 0 ]; then
  stage "pytest: unit tests (${TRAINBASE_TEST_WORKERS:-2} workers)"
  "${unit_tests[@]}"
else
  stage "pytest: unit tests (beside the build): waiting for their result"
  unit_result
fi

if [ "$built" = 1 ]; then
  stage "pytest: the build tests ($SCOPE) and the conformance suite on the built images"
  "$PY" -m pytest "${pytest_args[@]}" --junitxml=reports/junit.xml --durations=25 --durations-min=20
fi

if [ "$built" = 1 ]; then
  # each variant is built FROM the first image (or the first of the MPI kind it names); the
  # checks' verdict on that real image (the control) is the one pytest just gave it, where it
  # ran them all (reports/junit.xml)
  #
  # The suite as users install it (step 5) needs nothing of the variants' run but the built
  # images, so it runs beside it: the variants' time is mostly their small builds' exports and
  # container starts, one core each, and step 5's is a wheel build, a pip install and the
  # foreign image's apt (docs/ci.md has what this saves, measured). Its log is printed when the
  # variants end; either one failing fails the run.
  echo "==> the installed suite and the foreign image (beside the variants; log: reports/outside-checkout.log)"
  (
    echo "==> the installed suite: wheel -> fresh venv -> trainbase-conformance on one image, outside the checkout"
    start=$SECONDS
    bash scripts/installed-suite.sh reports/build.json static reports/installed-suite
    echo "    ($((SECONDS - start)) s)"
    echo "==> the installed suite on an image trainbase did not build (Azure ML's recipe, --expect): the recorded verdict"
    start=$SECONDS
    bash scripts/foreign-image.sh static,cpu reports/foreign
    echo "    ($((SECONDS - start)) s)"
  ) > reports/outside-checkout.log 2>&1 &
  outside_pid=$!
  stage "conformance self-test: broken variants of real images must fail the right checks"
  variants_rc=0
  "$PY" -m pytest tests/conformance/test_broken_variants.py --report reports/build.json -q \
      --control-junit reports/junit.xml \
      --junitxml=reports/broken-variants.xml --conformance-report reports/broken-variants.md || variants_rc=$?
  stage "the installed suite and the foreign image (beside the variants): waiting for their result"
  outside_rc=0
  wait "$outside_pid" || outside_rc=$?
  cat reports/outside-checkout.log
  if [ "$outside_rc" != 0 ]; then echo "the installed suite or the foreign image failed (exit $outside_rc)"; fi
  [ "$variants_rc" = 0 ] && [ "$outside_rc" = 0 ] || exit 1
fi
