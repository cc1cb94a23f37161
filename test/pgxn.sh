#!/usr/bin/env bash
#
# PGXN: META.json is valid (test/pgxn_meta.pl: the PGXN Meta Spec 1.0 and
# this tree's versions; also PGXN's own validator pgxn_meta when it is
# installed: cargo install pgxn_meta), and `make dist` makes
# outbox-VERSION.zip of the committed HEAD, which holds META.json, the
# control file and every SQL script the Makefile installs, and builds with
# PGXS once unpacked.  Needs a git work tree, pg_config, unzip (installed
# if missing when run as root).
# Prints "pgxn: PASS (...)" or "pgxn: FAIL (...)".
#
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
fail() { echo "pgxn: FAIL ($*)"; exit 1; }

perl test/pgxn_meta.pl META.json || fail "META.json"
if command -v pgxn_meta >/dev/null; then
	pgxn_meta META.json || fail "pgxn_meta META.json"
	echo "pgxn_meta: META.json valid"
fi
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || fail "not a git work tree: make dist archives HEAD"
# unzip reads the archive back: a tool of this test alone, installed here.
if ! command -v unzip >/dev/null && [ "$(id -u)" = 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends unzip >/dev/null
fi
command -v unzip >/dev/null || fail "unzip not found (package unzip)"

version=$(perl -MJSON::PP -0777 -e 'print decode_json(<>)->{version}' META.json)
zip=outbox-$version.zip
work=$(mktemp -d /tmp/outbox-pgxn.XXXXXX)
trap 'rm -rf "$work"' EXIT
rm -f "$zip"
make -s dist >/dev/null || fail "make dist"
[ -s "$zip" ] || fail "make dist made no $zip"
mv "$zip" "$work/"
unzip -q "$work/$zip" -d "$work" || fail "unzip $zip"
top=$work/outbox-$version
[ -d "$top" ] || fail "$zip has no outbox-$version/"
# What PGXN and a PGXS build read, and each script the Makefile installs.
data=$(make -s --no-print-directory -f Makefile -f <(printf 'print-data:\n\t@echo $(DATA)\n') print-data)
for f in META.json outbox.control Makefile $data; do
	[ -f "$top/$f" ] || fail "$zip lacks $f"
	cmp -s "$top/$f" "$f" || echo "pgxn: note: $f differs from the committed one (uncommitted change?)"
done
make -s -C "$top" >"$work/build.log" 2>&1 || { tail -n 20 "$work/build.log"; fail "the unpacked $zip does not build"; }
[ -f "$top/outbox.so" ] || fail "the unpacked $zip built no outbox.so"
echo "pgxn: PASS (META.json valid; $zip: $(unzip -Z1 "$work/$zip" | grep -vc '/$') files, holds $(echo $data), builds)"
