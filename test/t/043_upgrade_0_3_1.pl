# 043_upgrade_0_3_1.pl
#   Schema 0.3.1 -> 0.3.2 (resume_destination() answers true only when the
#   destination was holding rows) on both PostgreSQL hosts, each with a
#   filled database: outbox rows pending, sent and dead, inbox rows, and a
#   breaker row of every kind (closed with failures counted, closed with a
#   pause that is over, paused ahead, open, disabled).
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.1 (installed
#     through the committed scripts); the workers refuse the 0.3.1 schema
#     until then and say why;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.1 release
#     installed (test/fixtures/daemon-0.3.1-postgresql.sql).
#   For each: no row changes in the upgrade, resume_destination() then
#   answers as docs/http-api.md says and clears every count and pause, and
#   the schema equals a fresh install's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my %sql = (
	outbox => q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, state, attempt,
		destination, hold, last_error), E'\n' ORDER BY id) FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, payload, consumption, state,
		attempt), E'\n' ORDER BY id) FROM queuebox.inbox},
	breaker => q{SELECT string_agg(concat_ws('|', destination, state, failures, paused_until, opened_at,
		probe_at, last_error), E'\n' ORDER BY destination) FROM queuebox.destination_state});

# fill($node, $db): the same rows on both hosts
sub fill
{
	my ($node, $db) = @_;
	$node->safe_psql($db, q{
		INSERT INTO queuebox.outbox (topic, key, payload, destination)
		SELECT 'orders.created', 'k' || (g % 3), jsonb_build_object('n', g), 'web' FROM generate_series(1, 6) g;
		UPDATE queuebox.outbox SET state = 'sent', attempt = 1 WHERE id = (SELECT min(id) FROM queuebox.outbox);
		UPDATE queuebox.outbox SET state = 'dead', attempt = 3, last_error = 'HTTP 500'
			WHERE id = (SELECT max(id) FROM queuebox.outbox);
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
			VALUES ('hooks', 'h-1', '{"push": true}', 'push'), ('jobs', 'j-1', '{"pull": true}', 'pull');
		INSERT INTO queuebox.destination_state (destination, state, failures, paused_until, opened_at, probe_at, last_error)
		VALUES ('flaky',  'closed',   2, NULL, NULL, NULL, 'HTTP 500'),
		       ('waited', 'closed',   0, now() - interval '1 hour', NULL, NULL, 'HTTP 429'),
		       ('paused', 'closed',   0, now() + interval '1 hour', NULL, NULL, 'HTTP 429'),
		       ('broken', 'open',     5, NULL, now(), now() + interval '1 hour', 'HTTP 503'),
		       ('gone',   'disabled', 1, NULL, now(), NULL, 'HTTP 410 Gone'),
		       ('fine',   'closed',   0, NULL, NULL, NULL, NULL);
	});
	return;
}

# upgraded($node, $db, $what, \%before): the rows are as they were; then
# resume_destination() answers true only where rows were held, and leaves
# every destination closed with nothing counted
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	is($node->safe_psql($db, q{SELECT string_agg(d || '=' || queuebox.resume_destination(d), ' ' ORDER BY d)
		FROM unnest(ARRAY['broken', 'fine', 'flaky', 'gone', 'nosuch', 'paused', 'waited']) d}),
		'broken=true fine=false flaky=false gone=true nosuch=false paused=true waited=false',
		"$what: resume_destination() is true for open, disabled and paused ahead; false for closed, "
		  . 'a count without a circuit, a pause that is over, and an unknown name');
	is($node->safe_psql($db, q{SELECT string_agg(destination || ':' || state || '/' || failures || '/'
		|| (paused_until IS NULL), ' ' ORDER BY destination) FROM queuebox.destination_state}),
		'broken:closed/0/true fine:closed/0/true flaky:closed/0/true gone:closed/0/true paused:closed/0/true waited:closed/0/true',
		"$what: and every destination is closed, its count and pause cleared");
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# ---------------------------------------------------------------- the extension
my $node = qb_node('up031', create_extension => 0, conf => "queuebox.relay_worker = off\n");
$node->safe_psql('postgres', "CREATE EXTENSION queuebox VERSION '0.3.1'");
is(qb_version($node), '0.3.1', 'the extension is installed at version 0.3.1');
my $logstart = -s $node->logfile;
fill($node, 'postgres');
my $before = snapshot($node, 'postgres');
like(qb_wait_log($node, qr/queuebox outbox \d: .*run ALTER EXTENSION queuebox UPDATE/, $logstart, timeout => 60),
	qr/the queuebox schema in this database is version 0\.3\.1 and the library is version \Q$QB_LATEST\E; run ALTER EXTENSION queuebox UPDATE/,
	'the workers refuse the 0.3.1 schema and say to run the update');
$node->safe_psql('postgres', 'ALTER EXTENSION queuebox UPDATE');
is(qb_version($node), $QB_LATEST, "extversion is $QB_LATEST after the update");
upgraded($node, 'postgres', 'extension', $before);

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION queuebox');
is(qb_schema_description($node, 'postgres'), qb_schema_description($node, 'fresh'),
	'the upgraded extension equals a fresh install');
$node->stop;

# ---------------------------------------------------------------- the daemon
my $dn = qbd_node('up031d');
my $err = qbd_install_fixture($dn, '0.3.1');
is($dn->safe_psql('postgres', 'SELECT queuebox._schema_version()'), '0.3.1', "the daemon's 0.3.1 schema is installed")
  or diag $err;
fill($dn, 'postgres');
$before = snapshot($dn, 'postgres');

sub migrate { return qbd_migrate($dn, $_[0]); }
my $r = migrate('postgres');
is($r->[0], 0, '--migrate on the 0.3.1 schema exits 0') or diag $r->[2];
like($r->[2], qr/upgraded the QueueBox schema from 0\.3\.1 to \Q$QB_LATEST\E/, '--migrate says it upgraded from 0.3.1');
like($dn->safe_psql('postgres', 'SELECT string_agg(version, \',\' ORDER BY applied_at, version) FROM queuebox.schema_version'),
	qr/^0\.3\.1,0\.3\.2,(.*,)?\Q$QB_LATEST\E$/, 'schema_version records 0.3.1 and every step to the latest');
is($dn->safe_psql('postgres', 'SELECT queuebox._schema_version()'), $QB_LATEST, "_schema_version() says $QB_LATEST");
upgraded($dn, 'postgres', 'daemon', $before);
$r = migrate('postgres');
is($r->[0], 0, 'a second --migrate exits 0');
unlike($r->[2], qr/upgraded|created/, 'a second --migrate changes nothing');

$dn->safe_psql('postgres', 'CREATE DATABASE fresh OWNER qbd');
$r = migrate('fresh');
is($r->[0], 0, '--migrate makes a fresh schema') or diag $r->[2];
is(qb_schema_description($dn, 'postgres'), qb_schema_description($dn, 'fresh'),
	"the upgraded daemon schema equals a fresh install");
$dn->stop;

done_testing();
