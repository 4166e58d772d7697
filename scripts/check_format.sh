#!/usr/bin/env bash
# Checks that every C++ file git tracks is formatted as .clang-format says.
# Prints the files that are not (fix: clang-format -i FILE) and exits 1; exit 0 when clean,
# 77 (a skip to ctest) when it cannot check: no clang-format, or not a git checkout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! command -v clang-format > /dev/null; then
  echo "check_format: clang-format not found (apt-get install clang-format)"; exit 77
fi
if [ ! -d .git ] && ! git rev-parse --git-dir > /dev/null 2>&1; then
  echo "check_format: $root is not a git checkout"; exit 77
fi
bad=()
while IFS= read -r f; do
  if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then bad+=("$f"); fi
done < <(git ls-files '*.cc' '*.h' '*.cu')
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check_format: not formatted (clang-format -i): %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: $(git ls-files '*.cc' '*.h' '*.cu' | wc -l) files formatted as .clang-format says"
