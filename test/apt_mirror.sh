#!/usr/bin/env bash
#
# Prints the Debian mirror this machine's apt uses, read at run time from
# /etc/apt/sources.list and /etc/apt/sources.list.d/ (one-line .list and
# deb822 .sources files): the URI of the first enabled "deb" entry for a
# Debian suite with the main component.  With --security, the URI of the
# entry for a *-security suite instead (nothing printed if there is none).
# No mirror's name is written in the repository; test/fresh_machine.sh and
# test/matrix.sh debootstrap their chroots from what this prints.
# OUTBOX_APT_MIRROR, when set, is printed as it is (without --security).
#
# Usage: test/apt_mirror.sh [--security]; exit status 1 if none is found.
#
set -uo pipefail

want=main
[ "${1:-}" = --security ] && want=security
if [ "$want" = main ] && [ -n "${OUTBOX_APT_MIRROR:-}" ]; then
	echo "$OUTBOX_APT_MIRROR"
	exit 0
fi

# Every enabled entry as "URI SUITE COMPONENTS...", one a line.
entries() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		sed -E 's/#.*//; s/\[[^]]*\]//' "$f" | awk '$1 == "deb" { $1 = ""; print }'
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		# deb822 stanzas, separated by blank lines; one line per URI x suite.
		awk '
			function flush(   i, j, nu, ns, u, s) {
				if (types ~ /(^| )deb( |$)/ && enabled != "no") {
					nu = split(uris, u, " "); ns = split(suites, s, " ")
					for (i = 1; i <= nu; i++)
						for (j = 1; j <= ns; j++)
							print u[i], s[j], comps
				}
				types = uris = suites = comps = enabled = ""
			}
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); next }
			{
				key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
				if (key == "types") types = $0
				else if (key == "uris") uris = $0
				else if (key == "suites") suites = $0
				else if (key == "components") comps = $0
				else if (key == "enabled") enabled = tolower($0)
			}
			END { flush() }
		' "$f"
	done
}

entries | awk -v want="$want" '
	$3 !~ /(^| )main( |$)/ && $0 !~ / main( |$)/ { next }
	want == "security" && $2 ~ /-security$/ { print $1; exit }
	want == "main" && $2 !~ /-security$/ && $2 ~ /^(bullseye|bookworm|trixie|forky|duke|sid|stable|testing|unstable|oldstable)(-updates|-backports)?$/ { print $1; exit }
' | sed 's|/*$||' | grep . || exit 1
