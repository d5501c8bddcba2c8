// The Node tests' check(): stop at the first failure (exit 1 with what and
// why), count the checks passed.
export const checks = { passed: 0 };

export function check(ok, what, detail = "") {
  if (!ok) {
    console.error("FAIL:", what, detail);
    process.exit(1);
  }
  checks.passed++;
}
