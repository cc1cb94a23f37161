# pg_upgrade of a server with the extension to the next PostgreSQL major
# version: the old server's installation is $OUTBOX_PG_UPGRADE_FROM (e.g.
# /usr/lib/postgresql/15), the new one's is on PATH, the extension is
# installed for both (test/pg_upgrade.sh does this in a Debian trixie
# chroot with bookworm's PostgreSQL 15 beside trixie's 17); skipped
# without it.
# On the old server a producer and a consumer database are left in every
# state the extension knows (TAP 019's, test/perl/UpgradeTest.pm), more
# events pending with no worker running.  pg_upgrade --check accepts it as
# it is (no table of the extension has a reg* column whose OIDs pg_upgrade
# does not keep: inbox_subscription.handler is the handler's signature as
# text), and after pg_upgrade to a new cluster preloading the library, on
# the new server
#   - every row of every table of the extension is still there, unchanged,
#     the same events pending, the extension at the same version;
#   - the extension's objects equal those of a fresh install there;
#   - with the workers back, the pending events reach Kafka, each aggregate
#     complete and in version order, the blocked one once retried, and the
#     inbox (its handler found by its signature: function OIDs are not
#     kept) applies the new events exactly once from its stored offsets.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use OutboxTest qw(pinned_init);
use UpgradeTest;

my $old_path = $ENV{OUTBOX_PG_UPGRADE_FROM};
plan skip_all => 'OUTBOX_PG_UPGRADE_FROM (the older server installation) is not set: test/pg_upgrade.sh sets it'
  unless $old_path;
-x "$old_path/bin/pg_ctl" or BAIL_OUT("no server in $old_path");

my $version = `pg_config --sharedir`;
chomp $version;
open my $fh, '<', "$version/extension/outbox.control" or BAIL_OUT("outbox.control: $!");
($version) = map { /^default_version\s*=\s*'([^']+)'/ ? $1 : () } <$fh>;
close $fh;

# Both clusters with data checksums (PostgreSQL 18's initdb default).
my $t = start_pair($version, $version, install_path => $old_path, extra => ['--data-checksums'],
	tag => 'pg_upgrade');
my $old = $t->{node};
# The new cluster preloads the library with no database served while
# pg_upgrade runs its server.
my $new = PostgreSQL::Test::Cluster->new('pg_upgrade_new');
my ($old_major, $new_major) = map { $_->pg_version->major } $old, $new;
cmp_ok($new_major, '>', $old_major, "PostgreSQL $old_major -> $new_major");
$t->{what} = "pg_upgrade $old_major -> $new_major";
make_states($t);
quiesce_pair($t);
my $state = q{SELECT (SELECT extversion FROM pg_extension WHERE extname = 'outbox') || ' '
	|| (SELECT count(*) FROM outbox_pending) || ' '
	|| (SELECT string_agg(aggregate_id || ':' || last_published_version || ':' || coalesce(blocked_version, 0)
						  || ':' || paused, ',' ORDER BY aggregate_id) FROM aggregate_publication) || ' '
	|| (SELECT count(*) FROM outbox WHERE disposition = 'dead_lettered')};
my $before = $t->{p}->($state);
$old->stop;

pinned_init($new, extra => ['--data-checksums']);
$new->append_conf('postgresql.conf', $t->{conf} . "outbox.databases = 'none'\noutbox.inbox_workers = 0\n");
my @upgrade = ('pg_upgrade', '-b', "$old_path/bin", '-B', $new->config_data('--bindir'),
	'-d', $old->data_dir, '-D', $new->data_dir, '-p', $old->port, '-P', $new->port,
	'-s', $new->host);
chdir $PostgreSQL::Test::Utils::tmp_check or die "chdir: $!";

# As it is: pg_upgrade refuses tables with reg* columns of OIDs it does
# not keep (function OIDs above all); the extension's have none.
$new->command_ok([ @upgrade, '--check' ], 'pg_upgrade --check accepts the extension\'s tables as they are');
$new->command_ok(\@upgrade, "pg_upgrade $old_major -> $new_major");
$new->start;
$t->{node} = $new;

like($t->{p}->('SELECT version()'), qr/^PostgreSQL $new_major\./, "the new server runs PostgreSQL $new_major");
is($t->{p}->($state), $before, "$new_major: the same version, events pending, aggregates' state and dead letters");
rows_kept($t, $_) for qw(postgres consumer);
# A fresh install on the new server records initial privileges equal to the
# defaults for the extension's tables (ACL entries of the dump with no
# statement) where the upgraded database has none (seen 15 -> 17): the same
# privileges either way, and every GRANT and REVOKE is still compared.
$t->{bare_acls} = 1;
compare_fresh($t);
resume_pair($t);
done_testing();
