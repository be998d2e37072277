# 028_daemon.pl
#   queuebox-mssqld on a plain PostgreSQL (no shared_preload_libraries, no
#   extension, a login role that is not a superuser): the command line
#   (--version, --check, --migrate and what its failures say), the schema it
#   installs, delivery with retries, dead rows and per-key order, a Unix
#   socket in libpq's two URL forms, LISTEN, SIGHUP with a valid and an
#   invalid file, SIGTERM, and answers whose body never ends.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;
use Time::HiRes qw(usleep);
use File::Basename ();

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $node = qbd_node('daemon');
my $url = qbd_url($node);
my $sink = qb_sink_start(name => 'daemon');

sub conf
{
	my (%o) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 3, %{ $o{outbox} // {} } },
		destinations => $o{destinations} // {
			sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 2000 } },
		routes => $o{routes} // [ { topicPattern => 'orders.**', destination => 'sink' } ],
		database => { url => $url, %{ $o{database} // {} } },
		daemon => { outboxWorkers => $o{workers} // 2, shutdownGraceMs => 5000 });
}

# ---- the command line
my $r = qbd_run('--version');
is($r->[0], 0, '--version exits 0');
like($r->[1], qr/^queuebox-mssqld \d+\.\d+\.\d+ \(schema \d+\.\d+\.\d+\)$/m, '--version names the build and its schema');

$r = qbd_run('--config', qbd_write_conf(conf(), 'check'), '--check');
is($r->[0], 0, '--check on a valid file exits 0');
like($r->[1], qr/configuration file .* is valid: 1 destination, 1 route, 0 sources .* 2 outbox workers; database postgres:\/\/qbd\@127\.0\.0\.1:\d+\/postgres/,
	'--check says what the file configures');
is(qb_count_tables($node), '0', '--check does not touch the database');

$r = qbd_run('--config', qbd_write_conf(conf() . "bogus: 1\n", 'check'), '--check');
is($r->[0], 1, '--check on an unknown key exits 1');
like($r->[2], qr/configuration test failed: .*: bogus: unknown key/, '--check names the unknown key');

$r = qbd_run('--config', qbd_write_conf(conf(outbox => { batchSize => 'many' }), 'check'), '--check');
like($r->[2], qr/outbox\.batchSize: expected an integer from 1 to 10000, got "many"/,
	'--check names the key path and the reason of a bad value');

$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(database => { url => 'sqlserver://sa:Secret1@db:1433/app' }), 'check'), '--check');
is($r->[0], 0, 'a sqlserver:// URL passes --check (no connection is made)') or diag $r->[2];
like($r->[1], qr/database sqlserver:\/\/sa:\*\*\*\@db:1433\/app/, '--check shows the SQL Server URL with its password hidden');
unlike($r->[1] . $r->[2], qr/Secret1/, '--check does not repeat the password');
$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(database => { url => 'sqlserver://sa:Secret1@db:1433/app?sslmode=require' }), 'check'), '--check');
is($r->[0], 1, 'a SQL Server URL with an unknown option is refused');
like($r->[2], qr/database\.url: unknown option "sslmode"/, 'the refusal names the option');
unlike($r->[2], qr/Secret1/, 'the refusal does not repeat the password');

$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(), 'check'), '--check');
like($r->[2], qr/database\.url: queuebox-mssqld needs the database it serves/, 'a file without database.url is refused');

# ${NAME} and QUEUEBOX_ overrides follow the extension's rules
{
	local $ENV{QUEUEBOX_DATABASE_URL} = $url;
	$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(), 'check'), '--check');
	is($r->[0], 0, 'QUEUEBOX_DATABASE_URL gives database.url') or diag $r->[2];
	like($r->[1], qr/database postgres:\/\/qbd\@127\.0\.0\.1/, 'the override is the URL in force');
}
{
	local $ENV{QB_TEST_DB_PASSWORD} = 'Secret-from-env';
	$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(
		database => { url => 'postgres://qbd:${QB_TEST_DB_PASSWORD}@127.0.0.1:' . $node->port . '/postgres' }), 'check'), '--check');
	is($r->[0], 0, '${NAME} in database.url reads the environment');
	like($r->[1], qr/database postgres:\/\/qbd:\*\*\*\@127/, '--check shows the URL with its password hidden');
	unlike($r->[1] . $r->[2], qr/Secret-from-env/, 'the password from the environment is not printed');
}
$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(database => { url => 'postgres://qbd:${QB_TEST_UNSET_VAR}@h/db' }), 'check'), '--check');
like($r->[2], qr/database\.url: environment variable QB_TEST_UNSET_VAR is not set/, 'an unset ${NAME} is named');

$r = qbd_run('--check');
is($r->[0], 2, 'no --config: exit 2');
like($r->[2], qr/--config FILE is required/, 'no --config: says what is missing');

# ---- --migrate: the schema, as the role qbd, twice
$r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($r->[0], 0, '--migrate exits 0') or diag $r->[2];
like($r->[1], qr/schema queuebox in postgres:\/\/qbd\@127\.0\.0\.1:\d+\/postgres is at version \d/, '--migrate says the version');
like($r->[2], qr/created the QueueBox schema/, '--migrate created the schema');
is($node->safe_psql('postgres', q{SELECT string_agg(version, ',') FROM queuebox.schema_version}),
	$node->safe_psql('postgres', 'SELECT queuebox._schema_version()'),
	'schema_version records the version, as _schema_version() says');
is($node->safe_psql('postgres', q{SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'queuebox'}),
	'qbd', 'the schema belongs to the daemon role (no superuser needed)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_extension WHERE extname = 'queuebox'}),
	'0', 'no extension involved');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
	WHERE p.pronamespace = 'queuebox'::regnamespace AND l.lanname = 'c'}), '0', 'no C function in the schema');
for my $f (qw(enqueue inbox_claim inbox_renew inbox_complete inbox_retry inbox_dead requeue_outbox
	replay_outbox requeue_inbox destination_status resume_destination topic_matches route_of))
{
	ok($node->safe_psql('postgres', "SELECT count(*) > 0 FROM pg_proc WHERE proname = '$f' AND pronamespace = 'queuebox'::regnamespace") eq 't',
		"the schema has queuebox.$f()");
}
is($node->safe_psql('postgres', q{SELECT string_agg(destination, ',') FROM queuebox.config_route}),
	'sink', '--migrate writes the routes for route_of()');
is($node->safe_psql('postgres', q{SELECT queuebox.route_of('orders.created')}), 'sink', 'route_of() follows the file');

$r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($r->[0], 0, 'a second --migrate exits 0');
unlike($r->[2], qr/created/, 'a second --migrate creates nothing');

# two daemons migrating a new database at the same moment take turns
$node->safe_psql('postgres', 'CREATE DATABASE race OWNER qbd');
{
	my $race = qbd_write_conf(qb_config_yaml(database => { url => qbd_url($node, db => 'race') }), 'race');
	my @h;
	my @out;
	for my $i (0, 1)
	{
		$out[$i] = { out => '', err => '' };
		push @h, IPC::Run::start([ qbd_binary(), '--config', $race, '--migrate' ],
			'>', \$out[$i]{out}, '2>', \$out[$i]{err});
	}
	my @rc = map { $_->finish; $_->result(0) } @h;
	is("@rc", '0 0', 'two --migrate at once on a new database: both exit 0');
	is(scalar(grep { $_->{err} =~ /created the QueueBox schema/ } @out), 1,
		'two --migrate at once: exactly one creates the schema (the other waits on the migration lock)');
	is($node->safe_psql('race', 'SELECT count(*) FROM queuebox.schema_version'), '1',
		'two --migrate at once: one version recorded');
}

# a schema newer than the daemon knows is refused, with what to do
$node->safe_psql('postgres', q{INSERT INTO queuebox.schema_version (version, applied_at) VALUES ('9.9.9', now() + interval '1 s')});
$r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($r->[0], 1, 'a newer schema: --migrate exits 1');
like($r->[2], qr/at version 9\.9\.9, which this queuebox-mssqld \(schema [\d.]+\) does not know: a newer daemon migrated it\. Run that version/,
	'a newer schema is refused with what to do');
$node->safe_psql('postgres', q{DELETE FROM queuebox.schema_version WHERE version = '9.9.9'});

# ---- --migrate failures say what failed and what to do; none blames the build
$r = qbd_run('--config', qbd_write_conf(conf(database => { url => qbd_url($node, user => 'qbdpw', password => 'wrong-password') }),
	'migrate'), '--migrate');
is($r->[0], 1, 'a wrong password: --migrate exits 1');
like($r->[2], qr/^queuebox-mssqld: could not connect to postgres:\/\/qbdpw:\*\*\*\@127\.0\.0\.1:\d+\/postgres: .*password authentication failed for user "qbdpw"; check the user and the password in database\.url/m,
	'a wrong password: --migrate names the connection that failed and what to check');
unlike($r->[2], qr/build is broken/, 'a wrong password: the message does not blame the build');
unlike($r->[2], qr/wrong-password/, 'a wrong password: the message does not repeat it');
{
	# a database with the extension: its own cluster (the library preloaded)
	my $ext = qb_node('daemon_ext', conf => "listen_addresses = '127.0.0.1'\n");
	my $url_ext = qbd_url($ext, user => scalar(getpwuid($>)));
	$r = qbd_run('--config', qbd_write_conf(qb_config_yaml(database => { url => $url_ext }), 'ext'), '--migrate');
	is($r->[0], 1, 'the extension installed: --migrate exits 1');
	like($r->[2], qr/^queuebox-mssqld: the queuebox extension \(version [\d.]+\) is installed in database postgres, .*Use the daemon only where the extension cannot be loaded, or point database\.url at another database$/m,
		'the extension installed: --migrate says why it refuses and what to do');
	unlike($r->[2], qr/build is broken/, 'the extension installed: the message does not blame the build');
	# the start logs the same message, then retries
	my $de = qbd_start($ext, qb_config_yaml(database => { url => $url_ext }), name => 'ext');
	my $l = qbd_wait_daemon_log($de, qr/trying again in 1000 ms/);
	like($l, qr/ERROR supervisor\[\d+\]: the queuebox extension \(version [\d.]+\) is installed in database postgres, .*point database\.url at another database; trying again in 1000 ms$/m,
		'the extension installed: the start logs the refusal, then tries again');
	qbd_signal($de, 'TERM');
	is(qbd_wait_exit($de, 30), 0, 'the extension installed: the daemon stops on SIGTERM');
	$ext->stop;
}

# ---- delivery: the daemon serves the outbox
my $d = qbd_start($node, conf(), name => 'd1');
# the roles start in parallel: wait until all four said so
my $log = qbd_wait_daemon_log($d,
	qr/(?=.*outbox 0\[\d+\]: started)(?=.*outbox 1\[\d+\]: started)(?=.*relay\[\d+\]: started)(?=.*ingress\[\d+\]: started)/s);
like($log, qr/supervisor\[\d+\]: queuebox-mssqld [\d.]+ starting: configuration .*, database postgres:\/\/qbd\@/, 'the supervisor logs its start');
like($log, qr/outbox 0\[\d+\]: started/, 'outbox 0 started');
like($log, qr/relay\[\d+\]: started/, 'the relay started');
like($log, qr/ingress\[\d+\]: started/, 'the ingress started');
qb_wait_query($node, q{SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'queuebox-mssqld %'},
	'4', 'pg_stat_activity shows the four roles by application_name');
is(scalar(keys %{ qbd_role_pids($d) }), 4, 'ps shows the four role processes, named qb <role>');

$node->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO queuebox.outbox (topic, key, payload)
		SELECT 'orders.created', 'k' || (i % 10), jsonb_build_object('seq', i) FROM generate_series(1, 300) i;
	COMMIT;
	BEGIN;
	INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.rolled', '{}');
	ROLLBACK;
	INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.fail2', '{"_sink": {"fail": 2, "status": 500}}');
	INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.dead', '{"_sink": {"status": 503}}');
	INSERT INTO queuebox.outbox (topic, payload) VALUES ('nowhere.x', '{}');
});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state IN ('sent', 'dead')},
	'303', 'every row reaches a final state', timeout => 60);
my $o = qb_key_order($node, $sink, q{topic = 'orders.created'});
is($o->{delivered}, 300, 'the 300 keyed rows are delivered');
is($o->{keys_in_order}, 10, 'each of the 10 keys is delivered in id order');
is($o->{dups}, 0, 'no row is delivered twice');
is($node->safe_psql('postgres', q{SELECT state || ' ' || attempt FROM queuebox.outbox WHERE topic = 'orders.fail2'}),
	'sent 3', 'failed twice, then sent on the third attempt');
is($node->safe_psql('postgres', q{SELECT state || ' ' || attempt FROM queuebox.outbox WHERE topic = 'orders.dead'}),
	'dead 3', 'always 503: dead after outbox.maxAttempts');
like($node->safe_psql('postgres', q{SELECT state || ' ' || last_error FROM queuebox.outbox WHERE topic = 'nowhere.x'}),
	qr/^dead .*no route/, 'no route: dead at once');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.rolled'}), '0', 'a rolled-back row never exists');
is($node->safe_psql('postgres', q{SELECT state, rows FROM queuebox.outbox_stats WHERE destination = 'sink' AND state = 'sent'}),
	'sent|301', 'outbox_stats groups by destination on the daemon schema');
like($node->safe_psql('postgres', q{SELECT destination || ':' || state FROM queuebox.destination_status()}),
	qr/^sink:closed$/, 'destination_status() lists the file\'s destination');

# ---- SIGHUP with an invalid file: logged with the key path, nothing changes
my $off = -s $d->{log};
open(my $fh, '>', $d->{conf}) or die;
print $fh conf(outbox => { batchSize => 0 });
close $fh;
qbd_signal($d, 'HUP');
$log = qbd_wait_daemon_log($d, qr/configuration not reloaded/, $off);
like($log, qr/ERROR supervisor\[\d+\]: configuration not reloaded, the running one stays: .*outbox\.batchSize: expected an integer from 1 to 10000/,
	'an invalid file on SIGHUP is logged with its key path, and the running configuration stays');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.after_bad_hup', '{}')});
qb_wait_query($node, q{SELECT state FROM queuebox.outbox WHERE topic = 'orders.after_bad_hup'}, 'sent',
	'after an invalid reload, rows are still delivered');

# ---- SIGHUP with a valid file: a new route to a second path takes effect
$off = -s $d->{log};
open($fh, '>', $d->{conf}) or die;
print $fh conf(
	destinations => {
		sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 2000 },
		audit => { type => 'http', baseUrl => $sink->{url}, path => '/audit', timeoutMs => 2000 } },
	routes => [ { topicPattern => 'audit.*', destination => 'audit' }, { topicPattern => 'orders.**', destination => 'sink' } ]);
close $fh;
qbd_signal($d, 'HUP');
$log = qbd_wait_daemon_log($d, qr/configuration reloaded/, $off);
like($log, qr/configuration reloaded from /, 'a valid file on SIGHUP is reloaded');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('audit.login', '{"who": "ann"}')});
qb_wait_for(sub { grep { $_->{path} eq '/audit' } @{ qb_sink_requests($sink) } },
	'the reloaded route delivers to the new destination');
qb_wait_query($node, q{SELECT string_agg(destination, ',' ORDER BY position) FROM queuebox.config_route},
	'audit,sink', 'the reload rewrites the routes for route_of()');

# ---- SIGHUP that changes the role set: three outbox workers, then one
sub rewrite
{
	open(my $f, '>', $d->{conf}) or die;
	print $f conf(@_);
	close $f;
}
$off = -s $d->{log};
rewrite(workers => 3);
qbd_signal($d, 'HUP');
$log = qbd_wait_daemon_log($d, qr/outbox 2\[\d+\]: started/, $off);
like($log, qr/outbox 2\[\d+\]: started/, 'a reload with daemon.outboxWorkers 3 starts a third outbox worker');
$off = -s $d->{log};
rewrite(workers => 1);
qbd_signal($d, 'HUP');
$log = qbd_wait_daemon_log($d, qr/outbox 2 \(pid \d+\) exited.*outbox 1 \(pid \d+\) exited|outbox 1 \(pid \d+\) exited.*outbox 2 \(pid \d+\) exited/s, $off);
like($log, qr/stopping outbox 1: the configuration no longer needs it/, 'a reload with daemon.outboxWorkers 1 stops outbox 1');
like($log, qr/stopping outbox 2: the configuration no longer needs it/, '... and outbox 2');
qb_wait_for(sub { my $p = qbd_role_pids($d); $p->{'outbox 0'} && !$p->{'outbox 1'} && !$p->{'outbox 2'} },
	'one outbox worker runs after the reload');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.one_worker', '{}')});
qb_wait_query($node, q{SELECT state FROM queuebox.outbox WHERE topic = 'orders.one_worker'}, 'sent',
	'one outbox worker still delivers');

# ---- SIGHUP that changes the database section: every role restarts
my $pids = qbd_role_pids($d);
$off = -s $d->{log};
rewrite(workers => 1, database => { statementTimeoutMs => 20000 });
qbd_signal($d, 'HUP');
$log = qbd_wait_daemon_log($d, qr/(starting it again with the new database settings.*){3}/s, $off);
like($log, qr/the database settings changed, so every role restarts/, 'a reload that changes database: says every role restarts');
qb_wait_for(sub { my $p = qbd_role_pids($d); scalar(keys %$p) == 3 && !grep { $p->{$_} == ($pids->{$_} // 0) } keys %$p },
	'every role runs as a new process after a database: change');
unlike(qbd_log($d, $off), qr/restarting it in/, 'a restart asked by a reload is not counted as a crash');

# ---- SIGTERM: every role stops, the supervisor exits 0
$off = -s $d->{log};
qbd_signal($d, 'TERM');
my $st = qbd_wait_exit($d, 30);
is($st, 0, 'SIGTERM: the daemon exits 0');
$log = qbd_log($d, $off);
like($log, qr/outbox 0\[\d+\]: stopped: \d+ claims/, 'SIGTERM: outbox 0 logs what it did');
like($log, qr/supervisor\[\d+\]: stopped/, 'SIGTERM: the supervisor stops last');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'}), '0',
	'SIGTERM: no row is left processing');
qb_wait_query($node, q{SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'queuebox-mssqld %'},
	'0', 'SIGTERM: every connection is closed');

# ---- a Unix socket, in libpq's two ways to write it: the directory as
# host= in the query, or percent-encoded in the host's place.  Each daemon
# connects through it and delivers a row.
{
	my ($sock, $port) = ($node->host, $node->port);
	(my $enc = $sock) =~ s/([^A-Za-z0-9._~-])/sprintf('%%%02X', ord $1)/ge;
	my %forms = (query => "postgres://qbd\@/postgres?host=$sock&port=$port",
		encoded => "postgres://qbd\@$enc:$port/postgres");
	for my $form (sort keys %forms)
	{
		my $u = $forms{$form};
		my $topic = "orders.socket_$form";
		$r = qbd_run('--config', qbd_write_conf(conf(database => { url => $u }), 'socket'), '--check');
		is($r->[0], 0, "a Unix socket ($form): --check takes $u") or diag $r->[2];
		like($r->[1], qr/; database \Q$u\E$/m, "a Unix socket ($form): --check shows the URL");
		is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic'"), '0',
			"a Unix socket ($form): no row before");
		$d = qbd_start($node, conf(database => { url => $u }), name => "socket_$form");
		qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
		qb_wait_query($node, q{SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'queuebox-mssqld %'
			AND client_port = -1}, '4', "a Unix socket ($form): the four roles connect through the socket");
		$node->safe_psql('postgres', "INSERT INTO queuebox.outbox (topic, payload) VALUES ('$topic', '{}')");
		qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'", '1',
			"a Unix socket ($form): the row is sent");
		is(qb_key_order($node, $sink, "topic = '$topic'")->{delivered}, 1, "a Unix socket ($form): the sink received it");
		like(qbd_log($d), qr/LOG outbox 0\[\d+\]: configuration loaded: 1 destination, 1 route$/m,
			"a Unix socket ($form): the log counts 1 destination, 1 route");
		qbd_signal($d, 'TERM');
		is(qbd_wait_exit($d, 30), 0, "a Unix socket ($form): the daemon stops");
		qb_wait_query($node, q{SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'queuebox-mssqld %'},
			'0', "a Unix socket ($form): every connection is closed");
	}
}

# ---- LISTEN: with a poll of an hour, delivery depends on the NOTIFY
$d = qbd_start($node, conf(outbox => { pollIntervalMs => 3600000 }, database => { listen => 'true' }), name => 'listen');
qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
qb_wait_query($node, q{SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger
	WHERE tgname IN ('outbox_notify', 'inbox_notify')}, 'inbox_notify:O,outbox_notify:O',
	'database.listen: true enables the notify triggers');
# the roles LISTEN once connected; a row inserted before that waits for the
# next NOTIFY, so insert until one is delivered, then count
qb_wait_for(sub {
	$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.listen', '{}')});
	usleep(200_000);
	$node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.listen' AND state = 'sent'}) > 0;
}, 'with LISTEN and an hour-long poll, a committed row is delivered');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.listen2', '{}' FROM generate_series(1, 20)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.listen2' AND state = 'sent'},
	'20', 'with LISTEN, every later commit is delivered at once (no poll)', timeout => 30);
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the LISTEN daemon stops');

# listen off again: the triggers are disabled at the next start
$r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($node->safe_psql('postgres', q{SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger
	WHERE tgname IN ('outbox_notify', 'inbox_notify')}), 'inbox_notify:D,outbox_notify:D',
	'database.listen: false disables the notify triggers (no NOTIFY cost on inserts)');

# ---- an answer whose body never ends: read up to a bound, not until the
# 60 s timeout (the HTTP publisher is the extension's, TAP 002 too)
my $endless = qb_endless_start();
my ($edest, $eroutes) = qb_endless_routes($endless);
$d = qbd_start($node, conf(outbox => { maxAttempts => 2 }, destinations => $edest, routes => $eroutes), name => 'endless');
qb_endless_check($node, $endless, 'daemon');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon of the endless answers stops');
qb_endless_stop($endless);

# ---- the extension refuses a database the daemon manages
# (the library is not preloaded here: only the install script runs)
my ($ret, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION queuebox');
isnt($ret, 0, 'CREATE EXTENSION is refused where the daemon made the schema');
like($err, qr/schema "queuebox" is managed by queuebox-mssqld in this database/, 'the refusal says why');

# ---- the systemd unit is valid for systemd (sandboxing keys included)
SKIP:
{
	skip 'systemd-analyze is not installed', 1 unless -x '/usr/bin/systemd-analyze';
	my $src = "$FindBin::RealBin/../../../packaging/queuebox-mssqld.service";
	my $unit = "$PostgreSQL::Test::Utils::tmp_check/queuebox-mssqld.service";
	my $bindir = File::Basename::dirname(qbd_binary());
	open(my $in, '<', $src) or die "$src: $!";
	open(my $out, '>', $unit) or die "$unit: $!";
	while (<$in>) { s/\@BINDIR\@/$bindir/g; s/\@DOCDIR\@/\/usr\/local\/share\/doc\/queuebox/g; print $out $_; }
	close $in;
	close $out;
	my ($o, $e) = run_command([ '/usr/bin/systemd-analyze', 'verify', $unit ]);
	is("$o$e", '', 'systemd-analyze verify finds nothing wrong with packaging/queuebox-mssqld.service');
}

sub qb_count_tables
{
	my ($n) = @_;
	return $n->safe_psql('postgres', q{SELECT count(*) FROM pg_namespace WHERE nspname = 'queuebox'});
}

done_testing();
