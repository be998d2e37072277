# 046_upgrade_sweep.pl
#   Schema 0.3.2 -> 0.3.3 (the sweep of parked rows, outbox_parked_idx) on
#   both PostgreSQL hosts, each with a 0.3.2 database filled with the state
#   a missed promotion leaves (an engine that ignores the share lock a park
#   relies on, or an operator who ended a row by UPDATE):
#   - key ka: its first row sent, the four after it parked behind it, so
#     stranded: nothing would ever promote them;
#   - key kb: its first row pending (no claim met it yet), three parked
#     behind it: they wait for a row that is still open;
#   - key kc: its first row processing under a lease an hour long, two
#     parked behind it: they must stay parked.
#   The extension (ALTER EXTENSION queuebox UPDATE from 0.3.2, two outbox
#   workers) and the daemon (queuebox-mssqld --migrate on the schema its
#   0.3.2 release installed, test/fixtures/daemon-0.3.2-postgresql.sql, then
#   run with two outbox workers): the upgrade changes no row; then the sweep
#   releases ka's first parked row, ka and kb are delivered in key order,
#   kc's rows stay parked behind their open row; and the schema equals a
#   fresh install's.  On 0.3.2 code ka's rows stay parked for good.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $sink = qb_sink_start(name => 'sweep');
my $rows_sql = q{SELECT string_agg(concat_ws('|', id, key, state, hold, claim_token), E'\n' ORDER BY id)
	FROM queuebox.outbox};

sub config
{
	return qb_config_yaml(
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/sweep' } },
		routes => [ { topicPattern => '**', destination => 'web' } ],
		@_);
}

# fill($node, $routed): the three keys as the header says, in one
# transaction; routed to web (a released row goes back to its routed rows)
# or not (it goes to ready)
sub fill
{
	my ($node, $routed) = @_;
	my $dest = $routed ? q{'web'} : 'NULL';
	$node->safe_psql('postgres', qq{
		INSERT INTO queuebox.outbox (topic, key, payload, state, hold, claim_token, lease_until, destination)
		SELECT 'sweep.' || k, k, jsonb_build_object('n', n),
			   CASE WHEN n > 1 THEN 'pending' WHEN k = 'ka' THEN 'sent' WHEN k = 'kb' THEN 'pending'
					ELSE 'processing' END,
			   CASE WHEN n > 1 THEN 'key' END,
			   CASE WHEN n = 1 AND k = 'kc' THEN gen_random_uuid() END,
			   CASE WHEN n = 1 AND k = 'kc' THEN now() + interval '1 hour' END, $dest
		FROM (VALUES ('ka', 5), ('kb', 4), ('kc', 3)) v(k, m), generate_series(1, m) n
		ORDER BY k, n;
	});
	return;
}

# swept($node, $what): after the upgrade, with the workers running
sub swept
{
	my ($node, $what) = @_;
	qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE key IN ('ka', 'kb') AND state = 'sent'},
		'9', "$what: ka and kb are delivered (ka released by the sweep)", timeout => 60);
	my $o = qb_key_order($node, $sink, q{key IN ('ka', 'kb') AND NOT (key = 'ka' AND payload->>'n' = '1')});
	is($o->{keys_in_order}, $o->{keys}, "$what: each key in id order") or diag explain $o->{bad};
	is($node->safe_psql('postgres', q{SELECT string_agg(key || ':' || state || ':' || coalesce(hold, '-'), ' ' ORDER BY id)
		FROM queuebox.outbox WHERE key = 'kc'}),
		'kc:processing:- kc:pending:key kc:pending:key',
		"$what: kc's rows stay parked behind their open row");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE hold = 'key'}), '2',
		"$what: only kc's two rows are parked");
	return;
}

# ---------------------------------------------------------------- the extension
my $node = qb_node('sweep032', create_extension => 0, conf => "queuebox.relay_worker = off\n");
$node->safe_psql('postgres', "CREATE EXTENSION queuebox VERSION '0.3.2'");
is(qb_version($node), '0.3.2', 'the extension is installed at version 0.3.2');
qb_configure($node, config());
fill($node, 1);
my $before = $node->safe_psql('postgres', $rows_sql);
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE hold = 'key'}), '9',
	'extension: nine rows parked, four of them behind a sent row');
is($node->safe_psql('postgres', "BEGIN; ALTER EXTENSION queuebox UPDATE; $rows_sql; COMMIT;"), $before,
	'extension: the update changes no row');
is(qb_version($node), $QB_LATEST, "extversion is $QB_LATEST after the update");
swept($node, 'extension');

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION queuebox');
is(qb_schema_description($node, 'postgres'), qb_schema_description($node, 'fresh'),
	'the upgraded extension equals a fresh install');
$node->stop;

# ---------------------------------------------------------------- the daemon
my $dn = qbd_node('sweep032d');
my $err = qbd_install_fixture($dn, '0.3.2');
is($dn->safe_psql('postgres', 'SELECT queuebox._schema_version()'), '0.3.2', "the daemon's 0.3.2 schema is installed")
  or diag $err;
fill($dn, 0);
$before = $dn->safe_psql('postgres', $rows_sql);
my $r = qbd_migrate($dn, 'postgres');
is($r->[0], 0, '--migrate on the 0.3.2 schema exits 0') or diag $r->[2];
like($r->[2], qr/upgraded the QueueBox schema from 0\.3\.2 to \Q$QB_LATEST\E/, '--migrate says it upgraded from 0.3.2');
is($dn->safe_psql('postgres', $rows_sql), $before, 'daemon: the migration changes no row');
my $d = qbd_start($dn, config(database => { url => qbd_url($dn) }, daemon => { outboxWorkers => 2 }),
	name => 'sweep');
swept($dn, 'daemon');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');

$dn->safe_psql('postgres', 'CREATE DATABASE fresh OWNER qbd');
$r = qbd_migrate($dn, 'fresh');
is($r->[0], 0, '--migrate makes a fresh schema') or diag $r->[2];
is(qb_schema_description($dn, 'postgres'), qb_schema_description($dn, 'fresh'),
	'the upgraded daemon schema equals a fresh install');
$dn->stop;

done_testing();
