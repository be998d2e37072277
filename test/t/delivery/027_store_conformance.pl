# 027_store_conformance.pl
#   The store conformance suite (test/store/conformance.c) against a cluster
#   with the extension: once for the libpq store (`pq`: the daemon's way to
#   PostgreSQL) and once for the extension's SQL-callable wrappers (`spi`:
#   the statements the background workers run through SPI), so both stores
#   are held to one contract.  No worker runs (they would claim the rows the
#   scenarios set up).  A role with a password (scram) lets the pq store's
#   wrong-password scenario run.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $bin = qb_test_binary('test/store/conformance');
my $node = qb_node('conformance', workers => 0, conf => <<'EOC');
queuebox.relay_worker = off
queuebox.ingress_worker = off
queuebox.max_consumer_workers = 0
EOC

# a password role, checked before the trust lines the cluster was made with
my $pw = 'right-secret-4711';
$node->safe_psql('postgres', "CREATE ROLE qb_pw LOGIN PASSWORD '$pw'");
my $hba = $node->data_dir . '/pg_hba.conf';
my $old = PostgreSQL::Test::Utils::slurp_file($hba);
open(my $fh, '>', $hba) or die "cannot write $hba: $!";
print $fh "local all qb_pw scram-sha-256\nhost all qb_pw 127.0.0.1/32 scram-sha-256\n$old";
close($fh);
$node->reload;

my $dsn = $node->connstr('postgres');
my $bad_secret = 'wrong-secret-0815';
my ($out, $err) = run_command([ 'psql', '-X', '-At', '-c', 'SELECT 1',
	"$dsn user=qb_pw password=$pw" ]);
is($out, '1', 'the password role can log in with its password');

is(qb_outbox_count($node), '0', 'outbox is empty before the suite');

for my $kind ('pq', 'spi')
{
	local $ENV{QB_CONFORMANCE_DSN} = $dsn;
	local $ENV{QB_CONFORMANCE_BAD_DSN} = "$dsn user=qb_pw password=$bad_secret";
	local $ENV{QB_CONFORMANCE_BAD_PASSWORD} = $bad_secret;
	my ($stdout, $stderr) = ('', '');
	my $ok = IPC::Run::run([ $bin, $kind ], '>', \$stdout, '2>', \$stderr,
		IPC::Run::timeout(300));
	note "conformance $kind:\n$stdout$stderr";
	ok($ok, "the $kind store passes the conformance suite")
	  or diag "conformance $kind failed:\n$stdout$stderr";
	unlike("$stdout$stderr", qr/\Q$pw\E|\Q$bad_secret\E/, "no password in the $kind suite's output");
}

# ---- the libpq store on the daemon's own schema: a plain cluster, no
# extension, the schema made by queuebox-mssqld --migrate
my $plain = qbd_node('conformance_plain');
my $r = qbd_run('--config', qbd_write_conf(qb_config_yaml(database => { url => qbd_url($plain) }), 'conformance'),
	'--migrate');
is($r->[0], 0, 'queuebox-mssqld --migrate makes the daemon schema') or diag $r->[2];
{
	local $ENV{QB_CONFORMANCE_DSN} = $plain->connstr('postgres') . ' user=qbd';
	local $ENV{QB_CONFORMANCE_BAD_DSN} = $plain->connstr('postgres') . " host=127.0.0.1 user=qbdpw password=$bad_secret";
	local $ENV{QB_CONFORMANCE_BAD_PASSWORD} = $bad_secret;
	my ($stdout, $stderr) = ('', '');
	my $ok = IPC::Run::run([ $bin, 'pq' ], '>', \$stdout, '2>', \$stderr, IPC::Run::timeout(300));
	note "conformance pq (daemon schema):\n$stdout$stderr";
	ok($ok, 'the pq store passes the conformance suite on the daemon\'s schema (no extension)')
	  or diag "conformance pq on the daemon schema failed:\n$stdout$stderr";
}

done_testing();
