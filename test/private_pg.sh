# test/private_pg.sh: sourced by test/sanitize.sh and test/valgrind.sh.
#
# The tally of a run's steps (check, finish, die), and a private copy of
# the system PostgreSQL for a build of the extension that must not touch
# the system install.  The sourcing script sets $tally (the word its lines
# start with) and $root (its work directory) first.

passed=0
failed=0

# check NAME RC: count a step as passed (RC 0) or failed, and say so.
check() {
	if [ "$2" = 0 ]; then
		passed=$((passed + 1)); echo "== $tally $1: ok"
	else
		failed=$((failed + 1)); echo "== $tally $1: FAILED"
	fi
}

# finish: the summary line; exits non-zero if any step failed.
finish() {
	echo "$tally: work directory and logs in $root"
	echo "$tally: $passed passed, $failed failed"
	[ "$failed" = 0 ]
	exit
}

# die MESSAGE: a step that everything after it needs has failed.
die() {
	echo "$tally: $*" >&2
	failed=$((failed + 1))
	finish
}

# refuse_root: stop before wiping a work directory that is not one.
refuse_root() {
	case $root in
		/ | /tmp | /tmp/ | "") echo "$tally: refusing work directory '$root'" >&2; exit 2 ;;
	esac
}

# lock_root: one run at a time per work directory (fd 9 held until exit).
lock_root() {
	mkdir -p "$(dirname "$root")"
	exec 9>"$root.lock"
	flock -n 9 || { echo "$tally: another run holds $root.lock" >&2; exit 2; }
}

# private_pg PG_CONFIG: copy the server PG_CONFIG names (bin/lib and
# share) into $root at the same paths, so the copied binaries find the
# copied lib/ and share/ (Debian's are relocatable), and remove any outbox
# build from the copy.  Sets bindir, pkglibdir and sharedir (the copy's).
private_pg() {
	local pg_config=$1 sys_bindir sys_prefix sys_sharedir
	sys_bindir=$("$pg_config" --bindir) || die "pg_config not found"
	sys_prefix=$(dirname "$sys_bindir")
	sys_sharedir=$("$pg_config" --sharedir)
	rm -rf "$root"
	mkdir -p "$root$(dirname "$sys_prefix")" "$root$(dirname "$sys_sharedir")"
	cp -a "$sys_prefix" "$root$(dirname "$sys_prefix")/" || die "cannot copy $sys_prefix"
	cp -a "$sys_sharedir" "$root$(dirname "$sys_sharedir")/" || die "cannot copy $sys_sharedir"
	bindir=$root$sys_bindir
	pkglibdir=$("$bindir/pg_config" --pkglibdir)
	sharedir=$("$bindir/pg_config" --sharedir)
	if [ "$pkglibdir" != "$root$("$pg_config" --pkglibdir)" ] || [ "$sharedir" != "$root$sys_sharedir" ]; then
		die "the copied pg_config does not point into the copy (pkglibdir=$pkglibdir sharedir=$sharedir)"
	fi
	rm -f "$pkglibdir/outbox.so" "$sharedir"/extension/outbox[.-]*
	rm -rf "$pkglibdir/bitcode/outbox" "$pkglibdir/bitcode/outbox.index.bc"
}
