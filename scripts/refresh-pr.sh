#!/usr/bin/env bash
# The refresh workflow's last step (refresh.yml): propose the re-resolved locks as ONE pull
# request. The branch `trainbase/refresh` is force-pushed with today's proposal and its open
# pull request updated in place; pull requests of the older date-named `refresh/*` branches
# are closed as superseded. GH_TOKEN comes from the step's environment (gh is git's credential
# helper for the push: nothing is written to .git/config).
#   scripts/refresh-pr.sh BODY.txt     (BODY: the affected cells, `build.py --affected HEAD`)
set -euo pipefail
body="${1:?usage: refresh-pr.sh BODY.txt}"
if [ -z "$(git status --porcelain -- locks images matrix.yaml)" ]; then
  echo "no lock moved: nothing to propose"
  exit 0
fi
branch="trainbase/refresh"
title="refresh: series bumps, re-resolved pip locks and base images ($(date -u +%Y-%m-%d))"
git config user.name "trainbase refresh"
git config user.email "41898282+github-actions[bot]@users.noreply.github.com"
git switch -C "$branch"
git add locks images matrix.yaml
git commit -m "$title"
gh auth setup-git    # git asks gh for credentials; gh answers from GH_TOKEN (nothing stored)
# one refresh at a time: the branch is today's proposal, whatever an older one held
git push --force origin "$branch"
open_pr="$(gh pr list --head "$branch" --state open --json number --jq '.[0].number // empty')"
if [ -n "$open_pr" ]; then
  gh pr edit "$open_pr" --title "$title" --body-file "$body"
else
  gh pr create --base "${GITHUB_REF_NAME}" --head "$branch" --title "$title" --body-file "$body"
fi
# pull requests of the earlier date-named refresh branches are superseded by this one
gh pr list --state open --json number,headRefName --jq '.[] | select(.headRefName | startswith("refresh/")) | .number' |
  while read -r old; do
    gh pr close "$old" --delete-branch --comment "superseded by the refresh on branch $branch"
  done
