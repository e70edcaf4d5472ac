#!/usr/bin/env bash
# The refresh workflow's last step (refresh.yml `pull-request`): propose the re-resolved locks
# as ONE pull request. Run from the tree the allow-listed proposal was applied to, as the BASE
# commit's copy of this script (`bash ../base/scripts/refresh-pr.sh ...`: the proposal cannot
# change what runs here).
#   - only from the default branch: the refresh branch is main + one commit of data files, so
#     a dispatch from another branch (whose commits would ride along) is refused;
#   - force-pushes only its own branch, `trainbase/refresh`, from main's commit;
#   - edits only its own open pull request: same repository (a fork's branch of the same name
#     is not it), base main, its head the commit just pushed -- so it never retitles a pull
#     request over anyone else's commits (it labels it `trainbase-refresh`);
#   - closes nothing it did not make (no branch-prefix sweeps; the retired date-named
#     `refresh/*` pull requests, if any remain, are a person's to close).
# GH_TOKEN: the environment secret TRAINBASE_REFRESH_TOKEN (REFRESH_TOKEN) when set, so the
# pull request's CI starts; else the job's own token (WORKFLOW_TOKEN), said in a warning. gh is
# git's credential helper for the push: nothing is written to .git/config.
#   scripts/refresh-pr.sh BODY.txt     (BODY: the affected cells, `build.py affected HEAD`)
set -euo pipefail
body="${1:?usage: refresh-pr.sh BODY.txt}"
default_branch="${TRAINBASE_DEFAULT_BRANCH:-main}"
branch="trainbase/refresh"
label="trainbase-refresh"

die() { echo "refresh-pr: $*" >&2; exit 1; }
if [ "${GITHUB_REF:-}" != "refs/heads/$default_branch" ]; then
  die "runs only from $default_branch (this run is from ${GITHUB_REF:-no ref}): a refresh is $default_branch plus its data files"
fi
base_sha="$(git rev-parse HEAD)"
if [ -n "${GITHUB_SHA:-}" ] && [ "$base_sha" != "$GITHUB_SHA" ]; then
  die "the checkout is at $base_sha, not the run's commit $GITHUB_SHA of $default_branch"
fi
# anything changed outside the data files means the tree is not what the write job applied
if [ -n "$(git status --porcelain -- . ':!locks' ':!images' ':!matrix.yaml')" ]; then
  git status --porcelain -- . ':!locks' ':!images' ':!matrix.yaml' >&2
  die "changes outside matrix.yaml, locks/ and images/ (above): nothing is proposed"
fi
if [ -z "$(git status --porcelain -- locks images matrix.yaml)" ]; then
  echo "no lock moved: nothing to propose"
  exit 0
fi
if [ -z "${REFRESH_TOKEN:-}" ]; then
  echo "::warning::TRAINBASE_REFRESH_TOKEN is not set in the environment 'refresh': the pull request is opened with the workflow's token, so its CI does not start"
fi
export GH_TOKEN="${REFRESH_TOKEN:-${WORKFLOW_TOKEN:-${GH_TOKEN:-}}}"
[ -n "$GH_TOKEN" ] || die "no token (REFRESH_TOKEN or WORKFLOW_TOKEN)"

title="refresh: series bumps, re-resolved pip locks and base images ($(date -u +%Y-%m-%d))"
git config user.name "trainbase refresh"
git config user.email "41898282+github-actions[bot]@users.noreply.github.com"
git switch -C "$branch" "$base_sha"
git add -- locks images matrix.yaml
git commit -m "$title"
pushed="$(git rev-parse HEAD)"
gh auth setup-git    # git asks gh for credentials; gh answers from GH_TOKEN (nothing stored)
# one refresh at a time: the branch is today's proposal on main, whatever an older one held
git push --force origin "HEAD:refs/heads/$branch"

# our own open pull request: this repository's branch (a fork's branch of the same name is not
# it) into main; it must show the commit just pushed, else it is not retitled
mine="$(gh pr list --head "$branch" --base "$default_branch" --state open \
  --json number,isCrossRepository \
  --template '{{range .}}{{if not .isCrossRepository}}{{.number}}{{"\n"}}{{end}}{{end}}')"
mine="${mine%%$'\n'*}"   # one pull request per head branch and base: the first line
if [ -z "$mine" ]; then
  gh label create "$label" --color BFD4F2 --description "opened by scripts/refresh-pr.sh" 2>/dev/null || true
  gh pr create --base "$default_branch" --head "$branch" --label "$label" --title "$title" --body-file "$body"
  exit 0
fi
# the API may show the old head for a moment after the push
for _ in 1 2 3 4 5; do
  head="$(gh pr view "$mine" --json headRefOid --template '{{.headRefOid}}')"
  [ "$head" = "$pushed" ] && break
  sleep 3
done
if [ "$head" != "$pushed" ]; then
  die "pull request #$mine's head is $head, not the refresh just pushed ($pushed): left as it is"
fi
gh pr edit "$mine" --title "$title" --body-file "$body" --add-label "$label"
