#!/usr/bin/env bash
# Fails (exit 1, naming the files) when a tracked C++ file differs from the repository's
# .clang-format style. Run by ctest as the `format` test; `clang-format -i FILE` fixes one.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.hpp')
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check-format: no tracked C++ files (not a git checkout?)" >&2
  exit 1
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [[ ${#bad[@]} -gt 0 ]]; then
  printf 'check-format: not in .clang-format style: %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files in style"
