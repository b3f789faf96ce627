# Whitespace, the part of style a machine can judge without arguing:
# no trailing blanks, no tabs in C sources, a final newline everywhere
# (.editorconfig says the same to editors).
set -euo pipefail
bad=0
if git grep -n -I -E '[[:space:]]+$' -- ':!tests/fuzz/corpus' ':!LICENSE'; then
  echo "style: trailing whitespace above"; bad=1
fi
if git grep -n -I -P '\t' -- '*.c' '*.h'; then
  echo "style: tabs in C sources above"; bad=1
fi
# Text files only: git's own test (`git grep -I` skips binary files, the
# PNGs of docs/ among them).
for f in $(git grep -I -l '' -- ':!tests/fuzz/corpus'); do
  if [ -s "$f" ] && [ "$(tail -c 1 "$f" | od -An -c | tr -d ' ')" != '\n' ]; then
    echo "style: no final newline: $f"; bad=1
  fi
done
exit $bad
