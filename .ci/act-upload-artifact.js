// Stand-in for actions/upload-artifact's bundle (dist/upload/index.js), which the fetched repository lacks at the
// pinned commit (the mirror has no copy of that file): .ci/act puts it beside the real action.yml, so that the
// step's inputs reach it as they reach the action. It names what the step's paths match and applies
// if-no-files-found; it uploads nothing.
const fs = require("fs");

const input = (name) => (process.env[`INPUT_${name.toUpperCase()}`] || "").trim();
const name = input("name") || "artifact";
const paths = input("path").split("\n").map((line) => line.trim()).filter(Boolean);
const found = paths.filter((p) => fs.existsSync(p));
console.log(`upload-artifact stand-in: artifact ${name}: ${found.length ? found.join(" ") : "no files"}`);
if (!found.length && input("if-no-files-found") === "error") {
  console.log(`::error::no files found for artifact ${name} (${paths.join(" ")})`);
  process.exit(1);
}
